"""towers.BatchNorm against a hand-written single-device BatchNorm step."""

import numpy as np
import tensorflow as tf
from absl.testing import parameterized

import towers
from tests import test_util

MOMENTUM, EPSILON, LR = 0.9, 1e-3, 0.1


def _init(shape, seed, i):
    return tf.random.stateless_normal(shape, seed=[seed, i])


class Net(tf.Module):
    """dense - BatchNorm - relu - dense."""

    def __init__(self, sync, seed=0):
        super().__init__()
        self.w1 = tf.Variable(_init([5, 4], seed, 1), name="w1")
        self.bn = towers.BatchNorm(MOMENTUM, EPSILON, sync=sync)
        self.w2 = tf.Variable(_init([4, 3], seed, 2), name="w2")

    def __call__(self, x, training=True):
        return tf.matmul(tf.nn.relu(self.bn(tf.matmul(x, self.w1), training=training)), self.w2)


def _loss(model):
    def loss_fn(batch):
        x, y = batch
        logits = model(x)
        loss = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)
        return tf.reduce_mean(loss), logits

    return loss_fn


def _batch(size, seed):
    rng = np.random.default_rng(seed)
    x = (rng.normal(size=(size, 5)) + 0.5).astype(np.float32)
    return tf.constant(x), tf.constant(rng.integers(0, 3, size=(size,)).astype(np.int32))


class Reference:
    """BatchNorm written out on one device: one tape on the whole batch, a plain SGD update."""

    def __init__(self, seed=0):
        self.w1 = tf.Variable(_init([5, 4], seed, 1))
        self.gamma, self.beta = tf.Variable(tf.ones([4])), tf.Variable(tf.zeros([4]))
        self.w2 = tf.Variable(_init([4, 3], seed, 2))
        self.moving_mean, self.moving_variance = (
            tf.Variable(tf.zeros([4])),
            tf.Variable(tf.ones([4])),
        )

    def step(self, batch, shard_sizes=None):
        """One step; with `shard_sizes`, each shard normalized by its own statistics."""
        x, y = batch
        trained = [self.w1, self.gamma, self.beta, self.w2]
        with tf.GradientTape() as tape:
            h = tf.matmul(x, self.w1)
            mean, variance = tf.nn.moments(h, [0])
            parts = tf.split(h, shard_sizes) if shard_sizes else [h]
            normalized = []
            for part in parts:
                m, v = tf.nn.moments(part, [0]) if shard_sizes else (mean, variance)
                normalized.append((part - m) / tf.sqrt(v + EPSILON) * self.gamma + self.beta)
            logits = tf.matmul(tf.nn.relu(tf.concat(normalized, 0)), self.w2)
            loss = tf.reduce_mean(
                tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)
            )
        grads = tape.gradient(loss, trained)
        for var, grad in zip(trained, grads):
            var.assign_sub(LR * grad)
        self.moving_mean.assign(MOMENTUM * self.moving_mean + (1 - MOMENTUM) * mean)
        self.moving_variance.assign(MOMENTUM * self.moving_variance + (1 - MOMENTUM) * variance)
        return loss, logits, grads

    def named(self):
        return {
            "w1": self.w1,
            "bn/gamma": self.gamma,
            "bn/beta": self.beta,
            "w2": self.w2,
            "bn/moving_mean": self.moving_mean,
            "bn/moving_variance": self.moving_variance,
        }


def _built(net):
    net(tf.zeros([1, 5]), training=False)  # makes every variable (Replicated needs them)
    return net


def _setup(sync, strategy, devices):
    if strategy == "replicated":
        model = towers.Replicated(lambda: _built(Net(sync)), devices)
        return model, model.local, model.replicas[0]
    model = Net(sync)
    return model, lambda: model, model


def _step_fn(model, local, devices, seen):
    optimizer = towers.SGD(LR)

    @tf.function
    def step(batch):
        return towers.train_step(
            lambda b: _loss(local())(b),
            model,
            optimizer,
            batch,
            devices,
            gradient_hook=lambda grads, variables: seen.append(grads) or grads,
        )

    return step


class SyncTest(tf.test.TestCase, parameterized.TestCase):
    # 3K + 1 examples, one tower with one more: K = 2, 3 and 8 (4 took no path of its own).
    @parameterized.product(k=(2, 3, 8), strategy=("ps", "replicated"))
    def test_equals_one_device_on_the_whole_batch(self, k, strategy):
        devices = test_util.devices(k)
        model, local, first = _setup(True, strategy, devices)
        seen = []
        step = _step_fn(model, local, devices, seen)
        reference = Reference()
        for i in range(3):
            batch = _batch(3 * k + 1, seed=i)  # uneven shards
            loss, logits = step(batch)
            want_loss, want_logits, want_grads = reference.step(batch)
            test_util.assert_allclose(loss, want_loss, rtol=1e-5)
            test_util.assert_allclose(logits, want_logits, rtol=1e-5, atol=1e-5)
        # The hook saw the first trace's symbolic gradients; compare the last step's by value.
        names = list(towers.named_variables(first))
        trained = [n for n in names if "moving" not in n]
        self.assertEqual(sorted(trained), ["bn/beta", "bn/gamma", "w1", "w2"])
        want = reference.named()
        for name, var in towers.named_variables(first).items():
            test_util.assert_allclose(var, want[name], rtol=1e-5, atol=1e-6)
        if strategy == "replicated":
            towers.check_replicas_identical(model)

    def test_gradients_equal_one_device(self):
        devices = test_util.devices(3)
        model = Net(True)
        batch = _batch(10, seed=4)
        expected = Reference().step(batch)[2]  # w1, gamma, beta, w2

        @tf.function
        def grads(batch):
            shards = towers.ops.split_batch(batch, 3)
            per_tower = towers.replicate(
                lambda s: towers.tower_gradients(_loss(model), model, s)[2], shards, devices
            )
            return towers.ops.average_gradients(per_tower, weights=towers.ops.shard_sizes(batch, 3))

        averaged = grads(batch)  # builds the BatchNorm's variables first
        got = dict(zip([v.ref() for v in towers.variable_list(model)], averaged))
        for var, want in zip([model.w1, model.bn.gamma, model.bn.beta, model.w2], expected):
            test_util.assert_allclose(got[var.ref()], want, rtol=1e-5, atol=1e-6)

    def test_in_a_v1_graph_and_session(self):
        batch = [t.numpy() for t in _batch(10, seed=2)]
        reference = Reference()
        want_loss = reference.step(batch)[0]
        with tf.Graph().as_default():
            model = Net(True)
            loss, _ = towers.train_step(
                _loss(model),
                model,
                towers.SGD(LR),
                [tf.constant(b) for b in batch],
                test_util.devices(3),
            )
            with tf.compat.v1.Session(config=towers.session_config()) as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                got_loss = sess.run(loss)
                named = towers.named_variables(model)
                values = dict(zip(named, sess.run(list(named.values()))))
            collectives = [
                op
                for op in tf.compat.v1.get_default_graph().get_operations()
                if op.type == "CollectiveReduceV2"
                and test_util.local_device(op.device) == test_util.devices(3)[1]
            ]
        # Tower 1's exchanges (forward, then backward) each wait for the one before.
        self.assertGreaterEqual(len(collectives), 2)
        self.assertEqual({op.get_attr("timeout_seconds") for op in collectives}, {120.0})
        for before, after in zip(collectives, collectives[1:]):
            self.assertEqual(after.inputs[0].op.control_inputs, [before])
        test_util.assert_allclose(got_loss, want_loss, rtol=1e-5)
        for name, var in reference.named().items():
            test_util.assert_allclose(values[name], var, rtol=1e-5, atol=1e-6)

    def test_two_steps_of_one_v1_graph_run_alone(self):
        """A fine-tuning step beside the training step: neither waits for the other's data."""
        devices = test_util.devices(2)
        batch = [t.numpy() for t in _batch(6, seed=1)]
        with tf.Graph().as_default():
            model = Net(True)
            steps = []
            for size in (4, 6):
                x = tf.compat.v1.placeholder(tf.float32, [size, 5])
                y = tf.compat.v1.placeholder(tf.int32, [size])
                loss, _ = towers.train_step(_loss(model), model, towers.SGD(LR), (x, y), devices)
                steps.append((loss, x, y))
            with tf.compat.v1.Session(config=towers.session_config()) as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                loss, x, y = steps[1]
                self.assertTrue(np.isfinite(sess.run(loss, {x: batch[0], y: batch[1]})))

    def test_second_order_gradients_are_refused_clearly(self):
        devices = test_util.devices(2)
        model = Net(True)

        def penalized(batch):
            x, y = batch
            with tf.GradientTape() as inner:
                inner.watch(x)
                loss, logits = _loss(model)((x, y))
            return loss + tf.reduce_sum(tf.square(inner.gradient(loss, x))), logits

        @tf.function
        def step(batch):
            return towers.train_step(penalized, model, towers.SGD(LR), batch, devices)

        with self.assertRaisesRegex(ValueError, "Second-order gradients .* are not supported"):
            step(_batch(6, 0))

    def test_each_tower_exchanges_on_its_device_forward_and_backward(self):
        devices = test_util.devices(4)
        model = Net(True)
        step = _step_fn(model, lambda: model, devices, [])
        graph = step.get_concrete_function(_batch(9, 0)).graph
        found = {}
        for op in graph.get_operations():
            if op.type == "CollectiveReduceV2":
                device = test_util.local_device(op.device)
                found[device] = found.get(device, 0) + 1
        self.assertEqual(found, {d: 2 for d in devices})  # forward and backward
        timeouts = {
            op.get_attr("timeout_seconds")
            for op in graph.get_operations()
            if op.type == "CollectiveReduceV2"
        }
        self.assertEqual(timeouts, {0.0})  # none in a function, as CollectiveAllReduce's

    def test_eagerly_several_towers_refuse_clearly(self):
        model = Net(True)
        with self.assertRaisesRegex(ValueError, "must be built inside tf.function"):
            towers.train_step(
                _loss(model), model, towers.SGD(LR), _batch(6, 0), test_util.devices(2)
            )


class UnsyncedTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.parameters("ps", "replicated")
    def test_per_tower_statistics_and_moving_averages_moved_once(self, strategy):
        devices = test_util.devices(3)
        model, local, first = _setup(False, strategy, devices)
        step = _step_fn(model, local, devices, [])
        graph = step.get_concrete_function(_batch(7, 0)).graph
        collectives = [op for op in graph.get_operations() if op.type == "CollectiveReduceV2"]
        self.assertLen(collectives, 3)  # forward only: the moving averages' statistics
        reference = Reference()
        for i in range(2):
            batch = _batch(7, seed=i)
            _, logits = step(batch)
            _, want_logits, _ = reference.step(batch, shard_sizes=[3, 2, 2])
            test_util.assert_allclose(logits, want_logits, rtol=1e-5, atol=1e-5)
        want = reference.named()
        for name, var in towers.named_variables(first).items():
            test_util.assert_allclose(var, want[name], rtol=1e-5, atol=1e-6)
        if strategy == "replicated":
            towers.check_replicas_identical(model)


class InferenceAndArgumentsTest(tf.test.TestCase):
    def test_inference_uses_the_moving_averages_and_changes_nothing(self):
        bn = towers.BatchNorm()
        x = tf.constant([[1.0, 2.0], [3.0, 6.0]])
        bn(x, training=True)
        mean, variance = bn.moving_mean.numpy(), bn.moving_variance.numpy()
        self.assertAllClose(mean, 0.01 * np.array([2.0, 4.0]))
        y = bn(x, training=False)
        self.assertAllClose(y, (x - mean) / np.sqrt(variance + 1e-3))
        self.assertAllEqual(bn.moving_mean, mean)

    def test_which_tower_updates_state(self):
        devices = test_util.devices(3)
        self.assertTrue(towers.updates_state())  # outside towers
        shared = towers.replicate(lambda _: towers.updates_state(), [0, 0, 0], devices)
        self.assertEqual(shared, [True, False, False])  # one copy: the first tower
        replicas = towers.Replicated(lambda: Net(True), devices)
        own = towers.replicate(
            lambda _: towers.updates_state(), [0, 0, 0], devices, variable_strategy=replicas
        )
        self.assertEqual(own, [True, True, True])  # a copy each: every tower its own

    def test_outside_towers_is_one_device(self):
        x = tf.constant(_batch(6, 1)[0])
        mean, variance = towers.batch_moments(x, [0])
        want_mean, want_variance = tf.nn.moments(x, [0])
        self.assertAllClose(mean, want_mean)
        self.assertAllClose(variance, want_variance)

    def test_batch_moments_checks_and_normalizes_its_axes(self):
        x = tf.constant(_batch(6, 1)[0])
        mean, _ = towers.batch_moments(x, [-2])
        self.assertAllClose(mean, tf.reduce_mean(x, 0))
        for axes in ([], [0, 0], [2], ["0"]):
            with self.assertRaisesRegex(ValueError, "`axes` must"):
                towers.batch_moments(x, axes)
        with self.assertRaisesRegex(TypeError, "`x` must be floating"):
            towers.batch_moments(tf.ones([2, 2], tf.int32), [0])

    def test_synced_moments_must_reduce_the_batch_axis(self):
        with self.assertRaisesRegex(ValueError, "must include the batch axis 0"):
            towers.batch_moments(tf.ones([4, 3]), [1])

    def test_unsynced_moments_need_no_exchange_even_eagerly(self):
        devices = test_util.devices(2)
        shards = towers.ops.split_batch(tf.constant(_batch(5, 2)[0]), 2)
        means = towers.replicate(
            lambda s: towers.batch_moments(s, [0], sync=False)[0], shards, devices
        )
        self.assertAllClose(means[1], tf.reduce_mean(shards[1], 0))

    def test_towers_sharing_a_device_are_refused_when_built(self):
        """Before: built without error, then the collective waited for ever."""
        device = test_util.devices(1)[0]
        shards = towers.ops.split_batch(tf.constant(_batch(4, 2)[0]), 2)
        for step in (
            lambda s: towers.cross_tower_sum(tf.reduce_sum(s)),
            lambda s: towers.batch_moments(s, [0], sync=True)[0],
        ):
            with self.assertRaisesRegex(ValueError, "needs distinct devices, one tower each"):
                tf.function(
                    lambda step=step: towers.replicate(step, shards, [device, device])
                ).get_concrete_function()

    def test_a_tower_without_the_device_list_is_refused(self):
        with towers.TowerContext(0, "/device:CPU:0", 2):
            with self.assertRaisesRegex(ValueError, "knows no device list"):
                towers.cross_tower_sum(tf.ones([2]))

    def test_bad_arguments(self):
        with self.assertRaisesRegex(ValueError, r"`momentum` must be a finite number in \[0, 1\)"):
            towers.BatchNorm(momentum=1.0)
        with self.assertRaisesRegex(TypeError, r"`momentum` must be a finite number in \[0, 1\)"):
            towers.BatchNorm(momentum="0.9")
        for bad in (0, float("nan")):
            with self.assertRaisesRegex(ValueError, "`epsilon` must be a finite number > 0"):
                towers.BatchNorm(epsilon=bad)
        bn = towers.BatchNorm()
        with self.assertRaisesRegex(TypeError, "`training` must be a Python bool"):
            bn(tf.ones([2, 3]), training=tf.constant(True))
        with self.assertRaisesRegex(ValueError, "known rank >= 2"):
            bn(tf.ones([3]), training=True)
        with self.assertRaisesRegex(TypeError, "`x` must be floating"):
            bn(tf.ones([2, 3], tf.int32), training=True)


if __name__ == "__main__":
    tf.test.main()
