"""The non-finite guard covers every state a step changes, in every mode.

Before: with nonfinite="skip" a NaN in the batch left BatchNorm's moving mean NaN, and with
"raise" the error said "no variable was changed" while it was; a NaN micro-batch on an
accumulating call raised nothing and poisoned the sums for every later call; a learning rate
that became NaN at run time (a variable, a schedule) made the weights NaN silently.
"""

import numpy as np
import tensorflow as tf
from absl.testing import parameterized

import towers
from tests import test_util
from tests.towers.step.accumulator_test import _build, _concat


class _Normed(tf.Module):
    """A dense layer, then a synchronized BatchNorm."""

    def __init__(self):
        super().__init__(name="normed")
        self.kernel = tf.Variable(tf.random.stateless_normal([3, 4], seed=[1, 2]), name="kernel")
        self.norm = towers.BatchNorm(sync=True)

    def __call__(self, x):
        return self.norm(tf.matmul(x, self.kernel), training=True)


def _built_normed():
    model = _Normed()
    model.norm.__call__(tf.zeros([1, 4]), training=False)  # creates its variables
    return model


def _normed_step(model, devices, nonfinite, local=None):
    optimizer = towers.SGD(0.1)
    local = local or (lambda: model)

    def loss_fn(x):
        return tf.reduce_mean(tf.square(local()(x)))

    @tf.function
    def step(x):
        return towers.train_step(loss_fn, model, optimizer, x, devices, nonfinite=nonfinite)

    return step


def _poisonable(strategy, every, **options):
    """(model, accumulator, poison, step): an accumulating step whose loss is times `poison`
    (assign NaN to make a call's gradients bad)."""
    devices = test_util.devices(2)
    if strategy == "replicated":
        model = towers.Replicated(_build, devices)
        local = model.local
    else:
        model = _build()
        local = lambda: model  # noqa: E731
    accumulator, poison = towers.GradientAccumulator(every=every), tf.Variable(1.0)

    def loss_fn(batch):
        loss, logits = test_util.loss_fn(local())(batch)
        return loss * poison, logits

    @tf.function
    def step(batch):
        return towers.train_step(
            loss_fn, model, towers.SGD(0.5), batch, devices, accumulate=accumulator, **options
        )

    return model, accumulator, poison, step


class _Scaled(towers.schedules.Schedule):
    """A schedule of the user's: a variable times (1 + step)."""

    def __init__(self, scale):
        self.scale = scale

    def rate(self, step):
        return self.scale * (1.0 + step)


def _state(module):
    return [v.numpy() for v in module.variables]


class GuardTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.product(nonfinite=["skip", "raise"], strategy=["ps", "replicated"])
    def test_moving_averages_follow_the_verdict(self, nonfinite, strategy):
        devices = test_util.devices(2)
        if strategy == "replicated":
            model = towers.Replicated(_built_normed, devices)
            step = _normed_step(model, devices, nonfinite, model.local)
            trained = model.replicas
        else:
            model = _Normed()
            step = _normed_step(model, devices, nonfinite)
            trained = [model]
        good = np.random.default_rng(0).normal(size=(8, 3)).astype(np.float32)
        step(tf.constant(good))
        before = [_state(m) for m in trained]
        bad = good.copy()
        bad[5, 1] = np.nan
        if nonfinite == "raise":
            with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "nor optimizer state"):
                step(tf.constant(bad))
        else:
            step(tf.constant(bad))
        for module, state in zip(trained, before):
            for got, want in zip(_state(module), state):
                self.assertAllEqual(got, want)  # moving mean and variance included
        step(tf.constant(good))  # and the next good step trains on
        for module, state in zip(trained, before):
            changed = [not np.array_equal(g, w) for g, w in zip(_state(module), state)]
            self.assertTrue(all(changed))

    def test_moving_averages_update_when_finite_as_before(self):
        """Deferred to the verdict, the update is the one BatchNorm would have made."""
        devices = test_util.devices(2)
        model = _Normed()
        step = _normed_step(model, devices, "skip")
        x = np.random.default_rng(1).normal(size=(8, 3)).astype(np.float32)
        step(tf.constant(x))
        kernel = _Normed().kernel  # the same initial value
        y = x @ kernel.numpy()
        momentum = model.norm.momentum
        self.assertAllClose(model.norm.moving_mean, (1 - momentum) * y.mean(0), rtol=1e-5)
        want = momentum * 1.0 + (1 - momentum) * y.var(0)  # from its initial 1
        self.assertAllClose(model.norm.moving_variance, want, rtol=1e-5)

    @parameterized.parameters("ps", "replicated")
    def test_a_bad_micro_batch_is_left_out_of_the_sums(self, strategy):
        model, accumulator, poison, step = _poisonable(strategy, 3, nonfinite="skip")
        batches = [test_util.batch(n, seed=i) for i, n in enumerate((5, 7, 4))]
        step(batches[0])
        poison.assign(np.nan)
        step(batches[1])  # not an applying call: before, its NaN stayed in the sums
        poison.assign(1.0)
        step(batches[2])  # applies the mean of batches 0 and 2, over their 9 examples
        reference = _build()
        with tf.GradientTape() as tape:
            loss, _ = test_util.loss_fn(reference)(_concat(batches[0], batches[2]))
        grads = tape.gradient(loss, reference.trainable_variables)
        towers.SGD(0.5).apply_gradients(zip(grads, reference.trainable_variables))
        trained = model.replicas[0] if strategy == "replicated" else model
        for got, want in zip(trained.variables, reference.variables):
            test_util.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        self.assertEqual(float(accumulator.examples), 0.0)

    def test_the_loss_scale_hears_of_every_bad_call(self):
        """With accumulation, a bad micro-batch counts when it comes (before: only applying
        calls were judged, on the mean, which the skipped call no longer poisons)."""
        scale = towers.LossScale()
        _, accumulator, poison, step = _poisonable("ps", 3, loss_scale=scale)
        step(test_util.batch(4))
        poison.assign(np.nan)
        step(test_util.batch(4, seed=1))
        self.assertEqual(int(scale.skipped_steps), 1)  # at the call itself, not applying
        poison.assign(1.0)
        step(test_util.batch(4, seed=2))
        self.assertEqual(int(scale.skipped_steps), 1)
        self.assertEqual(float(accumulator.examples), 0.0)

    def test_a_bad_micro_batch_raises_at_its_call_and_adds_nothing(self):
        _, accumulator, poison, step = _poisonable("ps", 2, nonfinite="raise")

        poison.assign(np.nan)
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "accumulated sums"):
            step(test_util.batch(4))
        self.assertEqual(float(accumulator.examples), 0.0)
        for total in accumulator.sum_variables:
            self.assertAllEqual(total, tf.zeros_like(total))

    @parameterized.product(nonfinite=["skip", "raise"], rate=["variable", "schedule"])
    def test_a_learning_rate_gone_bad_changes_nothing(self, nonfinite, rate):
        devices = test_util.devices(2)
        model = _build()
        lr = tf.Variable(0.1)
        optimizer = towers.Adam(lr if rate == "variable" else _Scaled(lr))

        @tf.function
        def step(batch):
            return towers.train_step(
                test_util.loss_fn(model), model, optimizer, batch, devices, nonfinite=nonfinite
            )

        step(test_util.batch(4))
        before = _state(model) + [v.numpy() for v in optimizer.variables if v is not lr]
        lr.assign(np.inf)
        if nonfinite == "raise":
            with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "learning rate is NaN"):
                step(test_util.batch(4, seed=1))
        else:
            step(test_util.batch(4, seed=1))
        after = _state(model) + [v.numpy() for v in optimizer.variables if v is not lr]
        for got, want in zip(after, before):
            self.assertAllEqual(got, want)


if __name__ == "__main__":
    tf.test.main()
