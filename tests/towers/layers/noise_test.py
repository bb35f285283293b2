"""Noise per example: the same draws however the batch is split, so dropout keeps the promise.

Before: stateful dropout (Keras `Dropout` too) drew masks that depended on the number of
towers, so a model with dropout could not be checked against one device."""

import numpy as np
import tensorflow as tf
from absl.testing import parameterized

import towers
from tests import test_util


class _Dropped(tf.Module):
    """Dense, ReLU, dropout (a new mask every step), dense."""

    def __init__(self):
        super().__init__(name="dropped")
        rng = np.random.default_rng(3)
        self.w1 = tf.Variable(rng.normal(size=(5, 16)).astype(np.float32), name="w1")
        self.w2 = tf.Variable(rng.normal(size=(16, 3)).astype(np.float32), name="w2")
        self.step = tf.Variable(tf.constant(0, tf.int64), trainable=False, name="step")

    def __call__(self, x):
        hidden = tf.nn.relu(tf.matmul(x, self.w1))
        hidden = towers.dropout(hidden, 0.4, seed=tf.stack([tf.constant(7, tf.int64), self.step]))
        return tf.matmul(hidden, self.w2)


def _loss_fn(model):
    def fn(batch):
        x, y = batch
        return tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=model(x))
        )

    return fn


def _batch(n, seed):
    rng = np.random.default_rng(seed)
    return (
        tf.constant(rng.normal(size=(n, 5)), tf.float32),
        tf.constant(rng.integers(0, 3, size=(n,)), tf.int32),
    )


class NoiseTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.parameters(((3, 2, 2),), ((1, 6),), ((4, 1, 1, 1),))
    def test_draws_follow_the_example_not_the_split(self, sizes):
        """Odd rows (3 x 5 elements) put shard starts off Philox's 4-draw blocks."""
        x = tf.reshape(tf.range(sum(sizes) * 15, dtype=tf.float32), [sum(sizes), 3, 5])
        whole = towers.example_uniform(x, [5, 9])  # no towers: one device on the batch
        devices = test_util.devices(len(sizes))
        shards = tf.split(x, list(sizes))

        @tf.function
        def per_tower():
            return towers.replicate(lambda s: towers.example_uniform(s, [5, 9]), shards, devices)

        self.assertAllEqual(tf.concat(per_tower(), 0), whole)
        self.assertBetween(float(tf.reduce_mean(whole)), 0.4, 0.6)
        self.assertNotAllEqual(towers.example_uniform(x, [5, 10]), whole)

    @parameterized.parameters(1, 2, 3)
    def test_a_model_with_dropout_trains_like_one_device(self, micro_batches):
        devices = test_util.devices(3)
        model, reference = _Dropped(), _Dropped()
        optimizer = towers.SGD(0.2)

        @tf.function
        def step(batch):
            loss, _ = towers.train_step(
                _loss_fn(model), model, optimizer, batch, devices, micro_batches=micro_batches
            )
            model.step.assign_add(1)
            return loss

        for i in range(4):
            batch = _batch(11, seed=i)  # shards of 4, 4, 3: offsets 4 and 8, rows of 16
            loss = step(batch)
            with tf.GradientTape() as tape:  # the reference: one tape on the whole batch
                want = _loss_fn(reference)(batch)
            variables = [reference.w1, reference.w2]
            for grad, var in zip(tape.gradient(want, variables), variables):
                var.assign_sub(0.2 * grad)
            reference.step.assign_add(1)
            test_util.assert_allclose(loss, want, rtol=1e-6)
        test_util.assert_allclose(model.w1, reference.w1, rtol=1e-5, atol=1e-6)
        test_util.assert_allclose(model.w2, reference.w2, rtol=1e-5, atol=1e-6)

    def test_dropout_keeps_and_scales(self):
        x = tf.ones([200, 50])
        y = towers.dropout(x, 0.25, [1, 2])
        kept = tf.cast(y > 0, tf.float32)
        self.assertBetween(float(tf.reduce_mean(kept)), 0.72, 0.78)
        self.assertAllClose(tf.boolean_mask(y, y > 0), tf.fill([int(tf.reduce_sum(kept))], 4 / 3))
        self.assertIs(towers.dropout(x, 0.0, [1, 2]), x)
        half = towers.dropout(tf.ones([4, 4], tf.float16), 0.5, [1, 2])
        self.assertEqual(half.dtype, tf.float16)

    def test_the_noise_is_built_on_the_tower(self):
        devices = test_util.devices(2)
        shards = tf.split(tf.ones([4, 3]), 2)
        graph = (
            tf.function(
                lambda: towers.replicate(lambda s: towers.dropout(s, 0.5, [1, 2]), shards, devices)
            )
            .get_concrete_function()
            .graph
        )
        draws = [op for op in graph.get_operations() if op.type == "StatelessRandomUniformV2"]
        self.assertEqual(sorted(test_util.local_device(op.device) for op in draws), devices)

    def test_bad_arguments(self):
        x = tf.ones([4, 3])
        with self.assertRaisesRegex(ValueError, r"`rate` must be a finite number in \[0, 1\)"):
            towers.dropout(x, 1.0, [1, 2])
        with self.assertRaisesRegex(TypeError, "`rate` must be a finite number"):
            towers.dropout(x, "0.5", [1, 2])
        with self.assertRaisesRegex(TypeError, "`x` must be floating; got int32"):
            towers.dropout(tf.ones([4], tf.int32), 0.5, [1, 2])
        with self.assertRaisesRegex(ValueError, r"`seed` must be two integers \(shape \[2\]\)"):
            towers.dropout(x, 0.5, [1, 2, 3])
        with self.assertRaisesRegex(ValueError, r"`seed` must be two integers"):
            towers.dropout(x, 0.5, [1.0, 2.0])
        with self.assertRaisesRegex(ValueError, "must have a batch axis"):
            towers.example_uniform(tf.constant(1.0), [1, 2])


if __name__ == "__main__":
    tf.test.main()
