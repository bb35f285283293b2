"""Keras 3 and tf_keras layers and models as building blocks: found, trained, named stably."""

import json
import os

import keras
import numpy as np
import tensorflow as tf
import tf_keras
from absl.testing import parameterized

import towers
from tests import test_util

KERAS = (("keras", keras), ("tf_keras", tf_keras))


class Holder(tf.Module):
    """A tf.Module holding Keras layers: invisible to tf.Module.variables under Keras 3."""

    def __init__(self, k):
        super().__init__()
        self.embed = k.layers.Dense(5, activation="tanh")
        self.head = k.Sequential([k.layers.Dense(4, activation="relu"), k.layers.Dense(3)])

    def __call__(self, x):
        return self.head(self.embed(x))

    @property
    def by_hand(self):
        """The trainable tf.Variables, gathered as a user would (for the reference)."""
        found = self.embed.trainable_variables + self.head.trainable_variables
        return [getattr(v, "value", v) if not isinstance(v, tf.Variable) else v for v in found]


def _batch(size, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(size, 6)).astype(np.float32)
    y = rng.integers(0, 3, size=(size,)).astype(np.int32)
    return x, y


def _loss(model):
    def loss_fn(batch):
        x, y = batch
        logits = model(x)
        return tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)
        )

    return loss_fn


def _built(k, seed=0):
    k.utils.set_random_seed(seed)
    model = Holder(k)
    model(tf.zeros([1, 6]))
    return model


class NamesTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.named_parameters(*KERAS)
    def test_layers_in_a_module_are_found_by_path(self, k):
        model = _built(k)
        names = sorted(_names(model))
        self.assertEqual(
            names,
            [
                "embed/bias",
                "embed/kernel",
                "head/layers/0/bias",
                "head/layers/0/kernel",
                "head/layers/1/bias",
                "head/layers/1/kernel",
            ],
        )
        self.assertLen(towers.variable_list(model), 6)
        for var in towers.variable_list(model):
            self.assertIsInstance(var, tf.Variable)

    @parameterized.named_parameters(*KERAS)
    def test_names_ignore_keras_auto_numbering(self, k):
        first = _names(_built(k))
        for _ in range(3):  # more layers made in this process: "dense_9", ...
            k.layers.Dense(2)(tf.zeros([1, 2]))
        self.assertEqual(_names(_built(k)), first)

    @parameterized.named_parameters(*KERAS)
    def test_a_sequential_alone_and_frozen_layers(self, k):
        model = k.Sequential([k.layers.Dense(3), k.layers.BatchNormalization(), k.layers.Dense(2)])
        model(tf.zeros([1, 4]))
        self.assertEqual(
            sorted(_names(model)),
            [
                "layers/0/bias",
                "layers/0/kernel",
                "layers/1/beta",
                "layers/1/gamma",
                "layers/1/moving_mean",
                "layers/1/moving_variance",
                "layers/2/bias",
                "layers/2/kernel",
            ],
        )
        self.assertLen(towers.variable_list(model), 6)  # not the moving statistics
        model.layers[0].trainable = False
        self.assertLen(towers.variable_list(model), 4)


class DictTargetTest(tf.test.TestCase):
    def test_a_dict_of_keras_variables_is_a_target(self):
        """Before: a TypeError printing the whole value of the keras.Variable."""
        layer = keras.layers.Dense(3)
        layer.build((None, 2))
        named = towers.named_variables({"k": layer.kernel, "b": layer.bias})
        self.assertIs(named["k"], layer.kernel.value)
        self.assertIsInstance(named["b"], tf.Variable)
        big = tf.Variable(tf.zeros([1000]))
        with self.assertRaisesRegex(TypeError, r"got 'k': a ndarray \(shape \(1000,\)\)\.$"):
            towers.named_variables({"k": big.numpy()})
        with self.assertRaisesRegex(
            TypeError, r"hold only tf.Variable; got a \w*Tensor \(shape \(1000,\)\)"
        ):
            towers.named_variables([tf.zeros([1000])])


class TrainTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.product(k=("keras", "tf_keras"), strategy=("ps", "replicated"))
    def test_four_towers_equal_a_hand_written_single_device_loop(self, k, strategy):
        k = dict(KERAS)[k]
        devices = test_util.devices(4)
        if strategy == "replicated":
            model = towers.Replicated(lambda: _built(k), devices)
            local = model.local
        else:
            model = _built(k)
            local = lambda: model  # noqa: E731
        optimizer = towers.SGD(0.1, momentum=0.9)

        @tf.function
        def step(batch):
            return towers.train_step(lambda b: _loss(local())(b), model, optimizer, batch, devices)

        reference = _built(k)
        by_hand = test_util.reference_step(
            reference, _loss(reference), 0.1, momentum=0.9, variables=reference.by_hand
        )
        for i in range(5):
            batch = _batch(11, seed=i)  # uneven: 3, 3, 3, 2
            loss, _ = step(batch)
            want, _ = by_hand(batch)
            test_util.assert_allclose(loss, want, rtol=1e-5)
        trained = model.replicas[0] if strategy == "replicated" else model
        for name, var in towers.named_variables(trained).items():
            test_util.assert_allclose(
                var, towers.named_variables(reference)[name], rtol=1e-5, atol=1e-6
            )
        if strategy == "replicated":
            towers.check_replicas_identical(model)


class KerasBatchNormalizationTest(tf.test.TestCase):
    """What README says of Keras' BatchNormalization in towers, measured, and the fix."""

    def _moved(self, make_bn, k):
        """How far the moving mean moves in one step on k towers (one copy, the CPU)."""
        keras.utils.set_random_seed(0)
        dense, bn = keras.layers.Dense(4, kernel_initializer="ones"), make_bn()

        def net(x):
            return bn(dense(x), training=True)

        holder = tf.Module()
        holder.dense, holder.bn = dense, bn
        x = tf.constant(np.random.default_rng(0).normal(1.0, 1.0, size=(64, 3)), tf.float32)
        net(x[:1])
        bn.moving_mean.assign(tf.zeros([4]))

        @tf.function
        def step(batch):
            loss_fn = lambda b: tf.reduce_mean(net(b) ** 2)  # noqa: E731
            return towers.train_step(loss_fn, holder, towers.SGD(0.0), batch, test_util.devices(k))

        step(x)
        return float(np.abs(np.asarray(bn.moving_mean)).mean())

    def test_keras_moves_the_moving_mean_once_per_tower_towers_once_per_step(self):
        keras_bn = lambda: keras.layers.BatchNormalization(momentum=0.9)  # noqa: E731
        ratio = self._moved(keras_bn, 4) / self._moved(keras_bn, 1)
        self.assertAllClose(ratio, 3.40, atol=0.01)  # about (1 - 0.9**4) / (1 - 0.9)
        for sync in (False, True):
            ours = lambda s=sync: towers.BatchNorm(momentum=0.9, sync=s)  # noqa: E731
            self.assertAllClose(self._moved(ours, 4) / self._moved(ours, 1), 1.0, rtol=1e-5)


class WeightFilesTest(tf.test.TestCase):
    def test_restored_in_a_fresh_process_whatever_names_keras_gave(self):
        path = os.path.join(self.get_temp_dir(), "keras.npz")
        for _ in range(4):  # this process's layers are "dense_4"... the child's "dense"...
            keras.layers.Dense(2)(tf.zeros([1, 2]))
        model = _built(keras, seed=3)
        towers.save_weights(model, path)
        x = _batch(4)[0]
        want = model(x).numpy()
        got = test_util.run_python(
            f"""
import json, numpy as np, tensorflow as tf, keras, towers
from tests.towers.variables.keras_objects_test import Holder
model = Holder(keras)
model(tf.zeros([1, 6]))
towers.restore_weights(model, {path!r})
print(json.dumps(model(np.asarray({x.tolist()!r}, np.float32)).numpy().tolist()))
"""
        )
        test_util.assert_allclose(np.asarray(json.loads(got)), want, rtol=1e-6)


def _names(model):
    return list(towers.named_variables(model))


if __name__ == "__main__":
    tf.test.main()
