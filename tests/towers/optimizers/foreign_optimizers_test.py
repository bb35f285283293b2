"""Optimizers from elsewhere: Keras 3 and tf.compat.v1.train, on the parameter-server path."""

import os

import keras
import tensorflow as tf
from absl.testing import parameterized

import towers
from tests import test_util
from tests.towers.optimizers import optimizer_test

STEPS = 4


def _by_hand(optimizer, steps=STEPS):
    """The same optimizer in a hand-written single-device loop: one tape, its own update.

    On the CPU, where towers' default parameter server keeps the variables: a GPU has no
    kernel for v1 Momentum's sparse update (`ResourceSparseApplyMomentum`).
    """
    model = test_util.Model()

    @tf.function
    def step(batch):
        with tf.device("/cpu:0"):
            with tf.GradientTape() as tape:
                loss, _ = test_util.loss_fn(model)(batch)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(
                [(g, v) for g, v in zip(grads, model.trainable_variables) if g is not None]
            )

    for i in range(steps):
        step(test_util.batch(11, seed=i))
    return model


def _train(optimizer, devices, model=None, start=0, stop=STEPS):
    model = model or test_util.Model()

    @tf.function
    def step(batch):
        return towers.train_step(test_util.loss_fn(model), model, optimizer, batch, devices)

    for i in range(start, stop):
        step(test_util.batch(11, seed=i))
    return model


def _build():
    model = test_util.Model()
    model(test_util.batch(1)[0])
    return model


class ForeignOptimizerTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.parameters(
        ("keras adam", lambda: keras.optimizers.Adam(0.01)),
        ("keras sgd", lambda: keras.optimizers.SGD(0.1, momentum=0.9)),
        ("v1 momentum", lambda: tf.compat.v1.train.MomentumOptimizer(0.1, 0.9)),
        ("v1 adam", lambda: tf.compat.v1.train.AdamOptimizer(0.01)),
    )
    def test_parameter_server_steps_equal_the_same_optimizer_by_hand(self, _, make):
        """Their own rules (sparse rows lazily, for some): towers hands them the right mean."""
        model = _train(make(), test_util.devices(3))
        for got, want in zip(model.variables, _by_hand(make()).variables):
            test_util.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

    def test_replicated_refuses_them(self):
        devices = test_util.devices(2)

        replicas = towers.Replicated(_build, devices)
        for optimizer in (keras.optimizers.Adam(0.01), tf.compat.v1.train.AdamOptimizer(0.01)):
            with self.assertRaisesRegex(
                ValueError, "With 2 copies .* use a towers optimizer .* 2 times per step"
            ):
                towers.train_step(
                    lambda b: test_util.loss_fn(replicas.local())(b),
                    replicas,
                    optimizer,
                    test_util.batch(4),
                    devices,
                )

    def test_the_stage_by_stage_api_refuses_them_too(self):
        devices = test_util.devices(2)
        replicas = towers.Replicated(_build, devices)
        tower_grads = towers.replicate(
            lambda b: towers.tower_gradients(test_util.loss_fn(replicas.local()), replicas, b)[2],
            towers.ops.split_batch(test_util.batch(4), 2),
            devices,
            variable_strategy=replicas,
        )
        for optimizer in (keras.optimizers.Adam(0.01), tf.compat.v1.train.AdamOptimizer(0.01)):
            with self.assertRaisesRegex(ValueError, "With 2 copies .* use a towers optimizer"):
                towers.apply_replicated(replicas, tower_grads, [2, 2], optimizer)

    def test_a_keras_optimizers_state_for_variables_of_one_name_is_all_kept(self):
        """Keras names slots after TensorFlow names, which two variables may share."""
        directory = os.path.join(self.get_temp_dir(), "run")
        model, optimizer = optimizer_test.TwoBetas(), keras.optimizers.Adam(0.1)
        optimizer.build(list(model.variables))
        for var, value in zip(optimizer.variables[2:], range(1, 5)):
            var.assign(tf.fill(var.shape, float(value)))
        with towers.CheckpointManager(directory, model, optimizer) as manager:
            manager.save(1)
        again = keras.optimizers.Adam(0.1)
        with towers.CheckpointManager(directory, optimizer_test.TwoBetas(), again) as manager:
            self.assertEqual(manager.restore_latest(), 1)
        self.assertLen(again.variables, len(optimizer.variables))
        for got, want in zip(again.variables, optimizer.variables):
            self.assertAllEqual(got, want)

    def test_checkpoints_keep_a_keras_optimizers_state(self):
        directory = os.path.join(self.get_temp_dir(), "run")
        devices = test_util.devices(2)
        model, optimizer = test_util.Model(), keras.optimizers.Adam(0.01)
        with towers.CheckpointManager(directory, model, optimizer) as manager:
            _train(optimizer, devices, model, 0, 2)
            manager.save(2)
        model, optimizer = test_util.Model(seed=5), keras.optimizers.Adam(0.01)
        model(test_util.batch(1)[0])
        with towers.CheckpointManager(directory, model, optimizer) as manager:
            self.assertEqual(manager.restore_latest(), 2)
        _train(optimizer, devices, model, 2, STEPS)
        reference = _by_hand(keras.optimizers.Adam(0.01))
        for got, want in zip(model.variables, reference.variables):
            test_util.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

    def test_checkpoints_refuse_what_they_cannot_save_when_made(self):
        with self.assertRaisesRegex(TypeError, "creates its slots on its first update"):
            towers.CheckpointManager(
                self.get_temp_dir(), test_util.Model(), tf.compat.v1.train.AdamOptimizer(0.1)
            )


if __name__ == "__main__":
    tf.test.main()
