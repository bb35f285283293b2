"""Evaluation on every device: exact example-weighted metrics, merged outputs, placement."""

import numpy as np
import tensorflow as tf
from absl.testing import parameterized

import towers
from tests import test_util


def _data(size, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(size, 4)).astype(np.float32)
    y = rng.integers(0, 3, size=(size,)).astype(np.int64)
    return x, y


class Classifier(tf.Module):
    def __init__(self):
        super().__init__()
        self.w = tf.Variable(tf.random.stateless_normal([4, 3], seed=[0, 1]), name="w")

    def __call__(self, x):
        return tf.matmul(x, self.w)


def _fn(model_fn):
    def fn(shard):
        x, y = shard
        logits = model_fn()(x)
        loss = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)
        correct = tf.cast(tf.argmax(logits, 1) == y, tf.float32)
        return {"accuracy": correct, "loss": tf.reduce_mean(loss)}, logits

    return fn


class EvaluateTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.parameters("ps", "replicated")
    def test_exact_means_over_a_partial_last_batch(self, strategy):
        x, y = _data(23)
        devices = test_util.devices(4)
        if strategy == "replicated":
            model = towers.Replicated(Classifier, devices)
            fn, kwargs, first = _fn(model.local), {"variable_strategy": model}, model.replicas[0]
        else:
            model = Classifier()
            fn, kwargs, first = _fn(lambda: model), {}, model
        # Batches of 10, 10 and 3: the last has fewer examples than devices.
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(10)
        result = towers.evaluate(fn, dataset, devices, **kwargs)
        logits = x @ first.w.numpy()
        shifted = logits - logits.max(1, keepdims=True)
        log_softmax = shifted - np.log(np.exp(shifted).sum(1, keepdims=True))
        self.assertEqual(result.examples, 23)
        self.assertAllClose(result.metrics["accuracy"], np.mean(logits.argmax(1) == y))
        self.assertAllClose(
            result.metrics["loss"], -np.mean(log_softmax[np.arange(23), y]), rtol=1e-6
        )
        self.assertAllClose(result.outputs, logits, rtol=1e-5, atol=1e-6)

    def test_towers_run_on_their_devices(self):
        devices = test_util.devices(3)
        model, seen = Classifier(), []

        def fn(shard):
            seen.append(tf.constant(0.0).device)
            return {"accuracy": _fn(lambda: model)(shard)[0]["accuracy"]}

        towers.evaluate(fn, [_data(6)], devices)
        self.assertEqual([test_util.local_device(d) for d in seen], devices)

    def test_bad_results_are_refused(self):
        model, devices = Classifier(), test_util.devices(2)
        with self.assertRaisesRegex(TypeError, "must return a non-empty dict of metrics"):
            towers.evaluate(lambda s: model(s[0]), [_data(4)], devices)
        with self.assertRaisesRegex(ValueError, "must be a scalar .* or one value per example"):
            towers.evaluate(lambda s: {"m": model(s[0])}, [_data(4)], devices)
        with self.assertRaisesRegex(ValueError, "held no examples"):
            towers.evaluate(lambda s: {"m": model(s[0])}, [], devices)


if __name__ == "__main__":
    tf.test.main()
