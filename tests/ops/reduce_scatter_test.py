"""The all-reduce's halves, reduce-scatter and all-gather, against every algorithm."""

import numpy as np
import tensorflow as tf
from absl.testing import parameterized

from tests import test_util
from tests.ops.all_reduce_test import CPU_ALGORITHMS, _algorithm
from towers import ops


def _halves(algorithm, values, devices, sizes=None, **kwargs):
    """(reduce-scatter's parts, all-gather of them) of numpy `values`, in a tf.function."""

    @tf.function
    def run(*tensors):
        placed = []
        for tensor, device in zip(tensors, devices):
            with tf.device(device):
                placed.append(tf.identity(tensor))
        parts = algorithm.reduce_scatter(placed, devices, sizes=sizes, **kwargs)
        whole = algorithm.all_gather(parts, devices, sizes=sizes)
        return parts, whole, [t.device for t in parts + whole]

    parts, whole, placed = run(*[tf.constant(v) for v in values])
    return (
        [p.numpy() for p in parts],
        [w.numpy() for w in whole],
        [p.numpy().decode() for p in placed],
    )


class _Twin(ops.ReduceBroadcastAllReduce):
    """A group of twice these devices, as if another process held the other half."""

    def group_size(self, num_values):
        return 2 * num_values


class ReduceScatterAllGatherTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.product(algorithm=CPU_ALGORITHMS, sizes=[None, [0, 5, 1, 1]])
    def test_each_device_gets_its_part_and_every_device_the_whole(self, algorithm, sizes):
        rng = np.random.default_rng(0)
        values = [rng.normal(size=(7, 3)).astype(np.float32) for _ in range(4)]
        devices = test_util.devices(4)
        parts, whole, placed = _halves(_algorithm(algorithm), values, devices, sizes)
        total = np.sum(values, axis=0)
        cuts = np.cumsum([0, *(sizes or [2, 2, 2, 1])])
        for i, part in enumerate(parts):
            test_util.assert_allclose(part, total[cuts[i] : cuts[i + 1]], rtol=1e-6)
        for gathered in whole:
            np.testing.assert_array_equal(gathered, np.concatenate(parts))  # the parts, as sent
        np.testing.assert_array_equal(
            np.asarray(whole).view(np.uint32)[0], np.asarray(whole).view(np.uint32)[-1]
        )
        self.assertEqual([test_util.local_device(p) for p in placed], devices + devices)

    @parameterized.parameters(*CPU_ALGORITHMS)
    def test_integers_are_exact_and_the_mean_divides_by_the_group(self, algorithm):
        values = [np.arange(6, dtype=np.int64).reshape(6, 1) * (i + 1) for i in range(3)]
        parts, _, _ = _halves(_algorithm(algorithm), values, test_util.devices(3))
        np.testing.assert_array_equal(np.concatenate(parts), np.arange(6).reshape(6, 1) * 6)
        floats = [v.astype(np.float64) for v in values]
        parts, _, _ = _halves(_algorithm(algorithm), floats, test_util.devices(3), reduction="mean")
        np.testing.assert_allclose(np.concatenate(parts), np.arange(6).reshape(6, 1) * 2.0)

    def test_one_device_is_the_identity(self):
        parts, whole, _ = _halves(ops.RingAllReduce(), [np.ones([3], np.float32)], ["/cpu:0"])
        np.testing.assert_array_equal(parts[0], np.ones([3]))
        np.testing.assert_array_equal(whole[0], np.ones([3]))

    def test_bad_arguments(self):
        devices = test_util.devices(2)
        ring = ops.RingAllReduce()
        values = [tf.ones([4, 2]), tf.ones([4, 2])]
        with self.assertRaisesRegex(
            ValueError, r"`sizes` must be 2 ints .* summing to .* 4; got \[1, 2\]"
        ):
            ring.reduce_scatter(values, devices, sizes=[1, 2])
        with self.assertRaisesRegex(ValueError, r"`sizes` must be 2 ints"):
            ring.reduce_scatter(values, devices, sizes=[4, 0, 0])
        with self.assertRaisesRegex(ValueError, "sizes"):
            ring.reduce_scatter(values, devices, sizes=[5, -1])
        with self.assertRaisesRegex(ValueError, "first axis, which must be static; got shape"):
            ring.reduce_scatter([tf.ones([]), tf.ones([])], devices)
        with self.assertRaisesRegex(ValueError, r"Part 1 must have 3 rows .*; got shape \(1, 2\)"):
            ring.all_gather([tf.ones([1, 2]), tf.ones([1, 2])], devices, sizes=[1, 3])
        with self.assertRaisesRegex(ValueError, "agree in dtype and in every axis but the first"):
            ring.all_gather([tf.ones([1, 2]), tf.ones([1, 3])], devices)
        with self.assertRaisesRegex(TypeError, "adds numbers"):
            ring.reduce_scatter([tf.constant(["a"]), tf.constant(["b"])], devices)
        with self.assertRaisesRegex(ValueError, "beyond these devices needs `sizes`"):
            _Twin().all_gather([tf.ones([1]), tf.ones([1])], devices)


if __name__ == "__main__":
    tf.test.main()
