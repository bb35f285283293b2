import numpy as np
import tensorflow as tf
from absl.testing import parameterized

from tests import test_util
from towers import ops


def _towers(k=3):
    return [{"x": tf.fill([i + 1, 2], float(i)), "s": tf.constant(float(i))} for i in range(k)]


class MergeOutputsTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.product(k=[1, 2, 3, 8], batch=[8, 11])
    def test_concat_inverts_split(self, k, batch):
        inputs = test_util.batch(batch)
        shards = ops.split_batch(inputs, k)
        merged = ops.merge_outputs(shards, "concat")
        for got, want in zip(tf.nest.flatten(merged), tf.nest.flatten(inputs)):
            self.assertAllEqual(got, want)

    def test_weighted_mean_equals_the_whole_batch_mean(self):
        x = tf.constant(np.random.default_rng(0).normal(size=(11, 3)), tf.float32)
        shards = ops.split_batch(x, 4)
        means = [tf.reduce_mean(s, 0) for s in shards]
        merged = ops.merge_outputs(means, "mean", weights=ops.shard_sizes(x, 4))
        test_util.assert_allclose(merged, tf.reduce_mean(x, 0))
        unweighted = ops.merge_outputs(means, "mean")
        test_util.assert_allclose(unweighted, np.mean([m.numpy() for m in means], 0))

    def test_a_float64_mean_is_exact_in_float64(self):
        values = [tf.constant([0.1, 7.0], tf.float64), tf.constant([1.0, 3.0], tf.float64)]
        mean = ops.merge_outputs(values, "mean", weights=[3, 7])
        np.testing.assert_allclose(mean, [0.3 * 0.1 + 0.7, 0.3 * 7.0 + 2.1], rtol=1e-15)

    def test_sum_and_stack(self):
        values = [tf.constant([1.0, 2.0]) * i for i in range(4)]
        self.assertAllEqual(ops.merge_outputs(values, "sum"), [6.0, 12.0])
        self.assertAllEqual(ops.merge_outputs(values, "stack").shape, [4, 2])

    def test_a_mode_per_output(self):
        merged = ops.merge_outputs(_towers(), {"x": "concat", "s": "sum"})
        self.assertEqual(merged["x"].shape, [6, 2])
        self.assertEqual(float(merged["s"]), 3.0)

    def test_half_precision_mean_accumulates_in_float32(self):
        big = [tf.constant(60000.0, tf.float16)] * 2
        merged = ops.merge_outputs(big, "mean")
        self.assertEqual(merged.dtype, tf.float16)
        self.assertAllClose(merged, 60000.0)

    def test_merge_is_built_on_the_chosen_device(self):
        @tf.function
        def merge(a, b):
            with tf.device("/cpu:4"):
                ops.merge_outputs([a, b], "concat", device="/cpu:2")
                ops.merge_outputs([a, b], "sum")

        graph = merge.get_concrete_function(tf.zeros([2]), tf.zeros([2])).graph
        by_type = {op.type: op.device for op in graph.get_operations()}
        self.assertIn("CPU:2", by_type["ConcatV2"])
        self.assertIn("CPU:4", by_type["AddN"])

    def test_unknown_mode(self):
        with self.assertRaisesRegex(ValueError, r"one of \('concat'.*got 'average'"):
            ops.merge_outputs(_towers(), "average")

    def test_mode_structure_mismatch(self):
        with self.assertRaisesRegex(ValueError, "structure like one tower's output; got"):
            ops.merge_outputs(_towers(), {"x": "concat"})

    def test_towers_disagree_on_structure(self):
        per_tower = _towers(2) + [{"x": tf.zeros([1, 2])}]
        with self.assertRaisesRegex(ValueError, "tower 0 and tower 2 differ"):
            ops.merge_outputs(per_tower, "sum")

    def test_concat_of_scalars(self):
        with self.assertRaisesRegex(ValueError, r"Cannot concatenate output `outputs\['s'\]`"):
            ops.merge_outputs(_towers(), "concat")

    def test_mean_of_integers(self):
        with self.assertRaisesRegex(TypeError, "needs floating-point values; the output is int32"):
            ops.merge_outputs([tf.constant(1), tf.constant(2)], "mean")

    def test_bad_weights(self):
        with self.assertRaisesRegex(ValueError, "got 2 weights for 3 towers"):
            ops.merge_outputs(_towers(), "mean", weights=[1, 2])
        with self.assertRaisesRegex(
            ValueError, r"non-negative with a positive sum; got \[1, -1, 1\]"
        ):
            ops.merge_outputs(_towers(), "mean", weights=[1, -1, 1])
        for weights in ([1.0, float("nan"), 1.0], [1.0, float("inf"), 1.0]):  # before: NaN
            with self.assertRaisesRegex(ValueError, "`weights` must be finite"):
                ops.merge_outputs(_towers(), "mean", weights=weights)
        with self.assertRaisesRegex(ValueError, "non-negative with a positive sum"):
            ops.merge_outputs(_towers(), "mean", weights=[1, np.int64(-1), 1])  # before: taken
        with self.assertRaisesRegex(TypeError, "a number or a scalar tensor; got 'a'"):
            ops.merge_outputs(_towers(), "mean", weights=[1, "a", 1])
        modes = {"x": "concat", "s": "mean"}
        merged = ops.merge_outputs(_towers(), modes, weights=np.array([1, 1, 2]))
        self.assertAllEqual(merged["s"], 1.25)  # (0 + 1 + 2 * 2) / 4

    def test_no_towers(self):
        with self.assertRaisesRegex(ValueError, "at least one tower"):
            ops.merge_outputs([], "concat")


if __name__ == "__main__":
    tf.test.main()
