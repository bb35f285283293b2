"""Loss scaling and the non-finite guard: skipped steps are exactly the non-finite ones."""

import os

import numpy as np
import tensorflow as tf
from absl.testing import parameterized

import towers
from tests import test_util
from tests.towers.optimizers import rules_test as optimizers_test

BAD_STEP = 3


def _batch(step):
    """The test batches; step BAD_STEP holds an Inf feature: tanh saturates, so the loss stays
    finite while the gradient of w1 is NaN (Inf times 0)."""
    inputs, labels = test_util.batch(11, seed=step)
    if step == BAD_STEP:
        features = inputs["features"].numpy()
        features[4, 1] = np.inf
        inputs = {**inputs, "features": tf.constant(features)}
    return inputs, labels


def _build():
    model = test_util.Model()
    model(test_util.batch(1)[0])
    return model


def _numpy_adam(steps, skip=()):
    """Adam by hand on one device, whole batches, the `skip` steps left out."""
    model, states, t = _build(), {}, 0
    for step in range(steps):
        if step in skip:
            continue
        t += 1
        with tf.GradientTape() as tape:
            loss, _ = test_util.loss_fn(model)(_batch(step))
        for var, grad in zip(
            model.trainable_variables, tape.gradient(loss, model.trainable_variables)
        ):
            if grad is not None:
                state = states.setdefault(var.name, {})
                new = optimizers_test.np_adam(
                    var.numpy().astype(np.float64), test_util.dense(grad), state, t, 0.01
                )
                var.assign(new.astype(np.float32))
    return model


class DynamicLossScaleTest(tf.test.TestCase):
    def test_grows_after_a_run_and_backs_off_on_overflow(self):
        scale = towers.DynamicLossScale(initial_scale=8.0, growth_interval=2, min_scale=2.0)
        history = []
        for finite in (True, True, True, False, False, False, True):
            scale.update(tf.constant(finite))
            history.append(float(scale.scale))
        self.assertEqual(history, [8.0, 16.0, 16.0, 8.0, 4.0, 2.0, 2.0])
        self.assertEqual(int(scale.skipped_steps), 3)
        self.assertEqual(int(scale.good_steps), 1)

    def test_never_grows_to_inf(self):
        scale = towers.DynamicLossScale(initial_scale=2.0**127, growth_interval=1)
        scale.update(tf.constant(True))
        self.assertEqual(float(scale.scale), 2.0**127)  # 2^128 is inf in float32
        scale.update(tf.constant(False))
        self.assertEqual(float(scale.scale), 2.0**126)

    def test_arguments_are_checked(self):
        for make, error, message in [
            (lambda: towers.DynamicLossScale(growth_interval=0), ValueError, "an int >= 1"),
            (lambda: towers.DynamicLossScale(growth_factor=1.0), ValueError, "number > 1"),
            (lambda: towers.LossScale(0.0), ValueError, r"`scale` must be a finite number in \(0"),
            (lambda: towers.LossScale("big"), TypeError, "`scale` must be a finite number"),
            (
                lambda: towers.DynamicLossScale(1e39),
                ValueError,
                r"`initial_scale` must be a finite number in \(0, 3.40282e\+38\]; got 1e\+39",
            ),
        ]:
            with self.assertRaisesRegex(error, message):
                make()
        model = _build()
        for loss_scale, nonfinite, error, message in [
            ("big", "default", TypeError, "`loss_scale` must be None, a number or"),
            (-1.0, "default", ValueError, r"`loss_scale` must be a finite number in \(0"),
            (None, "ignore", ValueError, "`nonfinite` must be one of"),
            (towers.DynamicLossScale(), "raise", ValueError, "must be skipped, not 'raise'"),
        ]:
            with self.assertRaisesRegex(error, message):
                towers.train_step(
                    test_util.loss_fn(model),
                    model,
                    towers.SGD(0.1),
                    test_util.batch(4),
                    test_util.devices(2),
                    loss_scale=loss_scale,
                    nonfinite=nonfinite,
                )


class SkipTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.product(strategy=["ps", "replicated"], loss_scale=["dynamic", "guard"])
    def test_a_forced_overflow_skips_exactly_that_step(self, strategy, loss_scale):
        devices = test_util.devices(3)
        if strategy == "replicated":
            model = towers.Replicated(_build, devices)
            local = model.local
        else:
            model = _build()
            local = lambda: model  # noqa: E731
        scale = (
            towers.DynamicLossScale(2.0**10, growth_interval=2)
            if loss_scale == "dynamic"
            else towers.LossScale()
        )
        optimizer = towers.Adam(0.01)

        @tf.function
        def step(batch):
            return towers.train_step(
                lambda b: test_util.loss_fn(local())(b),
                model,
                optimizer,
                batch,
                devices,
                loss_scale=scale,
            )

        losses = [float(step(_batch(i))[0]) for i in range(6)]
        self.assertAllClose(losses[0], float(test_util.loss_fn(_build())(_batch(0))[0]))
        reference = _numpy_adam(6, skip=(BAD_STEP,))
        trained = model.replicas[-1] if strategy == "replicated" else model
        for got, want in zip(trained.variables, reference.variables):
            test_util.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        self.assertEqual(int(scale.skipped_steps), 1)
        self.assertEqual({int(c) for c in optimizer.iterations.values()}, {5})
        if loss_scale == "dynamic":  # 2 finite (x2), the overflow (/2), 2 finite (x2)
            self.assertEqual(float(scale.scale), 2.0**11)
        if strategy == "replicated":
            towers.check_replicas_identical(model)
            towers.check_replicas_identical(optimizer)

    def test_raise_is_the_default_and_changes_nothing(self):
        model = _build()
        before = [v.numpy() for v in model.variables]
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "The step changed nothing"):
            towers.train_step(
                test_util.loss_fn(model),
                model,
                towers.SGD(0.1, momentum=0.9),
                _batch(BAD_STEP),
                test_util.devices(2),
            )
        for got, want in zip(model.variables, before):
            self.assertAllEqual(got, want)

    def test_raise_in_a_function_waits_for_every_gradient(self):
        """Only the last gradient is NaN, yet no variable moves: every update waits."""
        model = _build()
        names = [v.name.split(":")[0] for v in model.trainable_variables]
        before = [v.numpy() for v in model.variables]

        def hook(grads, variables):
            return grads[:-1] + [grads[-1] * float("nan")]

        optimizer = towers.SGD(0.1, momentum=0.9)

        @tf.function
        def step(batch):
            return towers.train_step(
                test_util.loss_fn(model),
                model,
                optimizer,
                batch,
                test_util.devices(2),
                gradient_hook=hook,
            )

        with self.assertRaisesRegex(
            tf.errors.InvalidArgumentError, rf"(?s)gradients.*, for\] \[{names[-1]}\]"
        ):
            step(_batch(0))
        for got, want in zip(model.variables, before):
            self.assertAllEqual(got, want)

    def test_copies_skip_alike_when_only_one_copy_is_not_finite(self):
        devices = test_util.devices(2)
        replicas = towers.Replicated(_build, devices)
        before = [v.numpy() for v in replicas.replicas[0].variables]
        scale = towers.DynamicLossScale(2.0**10)

        def spoil_the_second_copy(grads, variables):
            if variables[0] is replicas.replicas[1].variables[0]:
                return [
                    None if g is None else tf.constant(test_util.dense(g) * np.nan) for g in grads
                ]
            return grads

        towers.train_step(
            lambda b: test_util.loss_fn(replicas.local())(b),
            replicas,
            towers.SGD(0.1),
            _batch(0),
            devices,
            gradient_hook=spoil_the_second_copy,
            loss_scale=scale,
        )
        towers.check_replicas_identical(replicas)
        for got, want in zip(replicas.replicas[0].variables, before):
            self.assertAllEqual(got, want)
        self.assertEqual(int(scale.skipped_steps), 1)

    def test_without_a_check_nan_reaches_the_weights(self):
        model = _build()
        towers.train_step(
            test_util.loss_fn(model),
            model,
            towers.SGD(0.1),
            _batch(BAD_STEP),
            test_util.devices(2),
            nonfinite=None,
        )
        self.assertTrue(np.isnan(model.w1.numpy()).any())

    def test_the_hook_sees_unscaled_gradients_and_the_loss_is_unscaled(self):
        model = _build()
        full = test_util.batch(11)
        expected, _ = test_util.reference_gradients(_build(), full)
        seen = []
        loss, _ = towers.train_step(
            test_util.loss_fn(model),
            model,
            towers.SGD(0.0),
            full,
            test_util.devices(3),
            loss_scale=2.0**12,
            gradient_hook=lambda g, v: seen.append(g) or g,
        )
        self.assertAllClose(loss, test_util.loss_fn(_build())(full)[0], rtol=1e-6)
        for got, want in zip(seen[0], expected):
            if want is not None:
                test_util.assert_allclose(test_util.dense(got), test_util.dense(want))


class ResumeTest(tf.test.TestCase):
    def test_the_scale_and_its_counts_resume_with_the_checkpoint(self):
        directory = os.path.join(self.get_temp_dir(), "run")
        scale = towers.DynamicLossScale(2.0**10, growth_interval=2)
        model, optimizer = _build(), towers.Adam(0.01)
        step = tf.function(
            lambda b: towers.train_step(
                test_util.loss_fn(model),
                model,
                optimizer,
                b,
                test_util.devices(2),
                loss_scale=scale,
            )
        )
        with towers.CheckpointManager(
            directory, model, optimizer, extra={"loss_scale": scale}
        ) as manager:
            for i in range(5):
                step(_batch(i))
            manager.save(5)
        fresh = towers.DynamicLossScale()
        with towers.CheckpointManager(
            directory, _build(), towers.Adam(0.01), extra={"loss_scale": fresh}
        ) as manager:
            self.assertEqual(manager.restore_latest(), 5)
        self.assertEqual(float(fresh.scale), float(scale.scale))
        self.assertEqual(int(fresh.skipped_steps), 1)
        self.assertEqual(int(fresh.good_steps), int(scale.good_steps))
        state = towers.read_weights(os.path.join(directory, "ckpt-00000005.state.npz"))
        self.assertIn("extra/loss_scale/scale", state)


if __name__ == "__main__":
    tf.test.main()
