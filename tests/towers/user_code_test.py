"""User code keeps AutoGraph's Python control flow while the library's own code is skipped."""

import tensorflow as tf

import towers
from tests import test_util


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


if __name__ == "__main__":
    tf.test.main()
