"""User code keeps AutoGraph's Python control flow while the library's own code is skipped."""

import sys

import tensorflow as tf

import towers
from tests import test_util
from towers import ops


def _gated_loss(model, gate):
    """The test model's loss, times 1 when `gate` > 0 else 0: a Python `if` on a tensor."""
    plain = test_util.loss_fn(model)

    def fn(batch):
        loss, logits = plain(batch)
        if gate > 0:
            factor = tf.constant(1.0)
        else:
            factor = tf.constant(0.0)
        return loss * factor, logits

    return fn


class _ClippingSGD:
    """A foreign optimizer whose rule uses Python control flow on tensors."""

    def __init__(self, learning_rate, limit):
        self.learning_rate, self.limit = learning_rate, limit

    def apply_gradients(self, pairs):
        updates = []
        for grad, var in pairs:
            grad = tf.convert_to_tensor(grad)
            if tf.norm(grad) > self.limit:
                grad = grad * (self.limit / tf.norm(grad))
            updates.append(var.assign_sub(self.learning_rate * grad))
        return tf.group(updates)


class UserCodeTest(tf.test.TestCase):
    def test_python_if_in_loss_becomes_a_cond(self):
        model, reference = test_util.Model(), test_util.Model()
        gate = tf.Variable(1.0)
        optimizer = towers.SGD(0.1)
        devices = test_util.devices(4)
        loss_fn = _gated_loss(model, gate)

        @tf.function
        def step(batch):
            return towers.train_step(loss_fn, model, optimizer, batch, devices)[0]

        reference_step = test_util.reference_step(reference, test_util.loss_fn(reference), 0.1)
        data = test_util.batch(24)
        self.assertAllClose(step(data), reference_step(data)[0], rtol=1e-6)
        for got, want in zip(model.trainable_variables, reference.trainable_variables):
            test_util.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        traced = step.experimental_get_tracing_count()
        gate.assign(-1.0)  # the same graph: the gate is read when the step runs
        before = [v.numpy() for v in model.trainable_variables]
        self.assertEqual(float(step(data)), 0.0)
        for got, want in zip(model.trainable_variables, before):
            self.assertAllEqual(got, want)
        self.assertEqual(step.experimental_get_tracing_count(), traced)

    def test_python_if_in_gradient_hook_and_foreign_optimizer(self):
        model, reference = test_util.Model(), test_util.Model()
        limit = 0.05
        data = test_util.batch(24)
        devices = test_util.devices(3)

        def hook(grads, variables):
            factor = tf.constant(1.0)
            if tf.linalg.global_norm([g for g in grads if g is not None]) > 1e9:  # never
                factor = tf.constant(0.0)
            return [None if g is None else tf.convert_to_tensor(g) * factor for g in grads]

        @tf.function
        def step(batch):
            return towers.train_step(
                test_util.loss_fn(model),
                model,
                _ClippingSGD(0.1, limit),
                batch,
                devices,
                gradient_hook=hook,
            )[0]

        step(data)
        grads, variables = test_util.reference_gradients(reference, data)
        for grad, var in zip(grads, variables):
            if grad is not None:
                grad = tf.convert_to_tensor(grad)
                norm = tf.norm(grad)
                var.assign_sub(0.1 * (grad * limit / norm if norm > limit else grad))
        for got, want in zip(model.trainable_variables, reference.trainable_variables):
            test_util.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

    def test_python_if_in_replicated_function(self):
        devices = test_util.devices(2)
        shards = [tf.constant([1.0, 2.0]), tf.constant([-3.0])]

        def fn(shard):  # defined outside the tf.function, which would convert it itself
            if tf.reduce_sum(shard) > 0:
                return tf.reduce_sum(shard)
            return -tf.reduce_sum(shard)

        @tf.function
        def run(shards):
            return towers.replicate(fn, shards, devices)

        self.assertAllClose(run(shards), [3.0, 3.0])

    def test_no_conversion_the_caller_did_not_ask_for(self):
        model = test_util.Model()
        loss_fn = _gated_loss(model, tf.Variable(1.0))
        devices = test_util.devices(2)

        @tf.function(autograph=False)
        def step(batch):
            return towers.train_step(loss_fn, model, towers.SGD(0.1), batch, devices)[0]

        with self.assertRaisesRegex(TypeError, "bool"):
            step(test_util.batch(8))


class LibraryCodeTest(tf.test.TestCase):
    """The rule: no function of towers or towers.ops runs converted by AutoGraph.

    AutoGraph runs a converted function from a generated file, with the original function's
    module globals; a profile of the trace sees every such call.
    """

    def _converted_modules(self, fn, *args):
        seen = set()

        def profile(frame, event, arg):
            del arg
            code = frame.f_code  # a converted function: tf__<name>, in a generated file
            if (
                event == "call"
                and code.co_name.startswith("tf__")
                and ("__autograph_generated_file" in code.co_filename)
            ):
                seen.add((frame.f_globals.get("__name__", "?"), code.co_name))

        sys.setprofile(profile)
        try:
            tf.function(fn).get_concrete_function(*args)
        finally:
            sys.setprofile(None)
        return seen

    def test_no_library_function_called_from_user_code_is_converted(self):
        devices = test_util.devices(2)
        model, other = test_util.built_model(), test_util.built_model()
        bn = towers.BatchNorm(sync=True)

        def user_loss(batch):  # user code calls the public stages from inside a tower
            inputs, labels = batch
            tower = towers.current_tower()
            hidden = bn(tf.expand_dims(inputs["features"], 1), training=True)
            mean, _ = towers.batch_moments(hidden, [0, 1])
            total = towers.cross_tower_sum(tf.reduce_sum(mean), weight=1.0)
            towers.summary_scalar("user/total", total)
            loss, logits = test_util.loss_fn(model)(batch)
            if tower.is_chief:
                loss = loss + 0.0 * total
            return loss, logits

        def user_step(batch):
            shards = ops.split_batch(batch, 2)
            sizes = ops.shard_sizes(batch, 2)
            merged = ops.merge_outputs([s[1] for s in shards], "concat", weights=sizes)
            loss, _ = towers.train_step(user_loss, model, towers.SGD(0.1), batch, devices)
            grads = [[tf.ones([2])], [tf.ones([2])]]
            mean = ops.average_gradients(grads, weights=sizes)
            buckets = ops.pack([tf.ones([3]), tf.ones([2])], ops.pack_spec([tf.ones([3])], 64))
            tower_loss, _, _ = towers.tower_gradients(test_util.loss_fn(other), other, batch)
            return loss, merged, mean, buckets, tower_loss

        converted = self._converted_modules(user_step, test_util.batch(6))
        self.assertIn((__name__, "tf__user_loss"), converted)  # user code is, as it should be
        library = sorted((m, f) for m, f in converted if m.split(".")[0] == "towers")
        # user_code_entry's wrapper alone runs converted, on purpose: it reads the caller's
        # AutoGraph status, and runs the library function itself unconverted.
        self.assertEqual(library, [("towers.core._autograph", "tf__entry")])


if __name__ == "__main__":
    tf.test.main()
