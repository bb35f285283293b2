import numpy as np
import tensorflow as tf
from absl.testing import parameterized

import ops
from tests import test_util

CPU_ALGORITHMS = ("reduce_broadcast", "ring", "collective", "auto")


def _run(algorithm, values, devices, **kwargs):
    """All-reduces numpy `values` placed on `devices` inside a tf.function."""

    @tf.function
    def reduce(*tensors):
        placed = []
        for tensor, device in zip(tensors, devices):
            with tf.device(device):
                placed.append(tf.identity(tensor))
        out = ops.all_reduce_algorithm(algorithm)(placed, devices, **kwargs)
        return out, [t.device for t in out]

    out, placement = reduce(*[tf.constant(v) for v in values])
    return [o.numpy() for o in out], [p.numpy().decode() for p in placement]


def _graph(algorithm, devices, spec, **kwargs):
    """The function graph of `algorithm` on copies of one input, and its results' devices."""
    built_on = []

    @tf.function
    def reduce(x):
        placed = []
        for device in devices:
            with tf.device(device):
                placed.append(x * 2.0)
        out = algorithm(placed, devices, **kwargs)
        built_on.extend(test_util.local_device(t.device) for t in out)
        return out

    return reduce.get_concrete_function(spec).graph, built_on


class AllReduceTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.product(algorithm=CPU_ALGORITHMS, k=[2, 3, 4, 8], reduction=["sum", "mean"])
    def test_equals_the_sum_on_every_device(self, algorithm, k, reduction):
        rng = np.random.default_rng(k)
        values = [rng.normal(size=(5, 7)).astype(np.float32) for _ in range(k)]
        devices = test_util.devices(k)
        out, _ = _run(algorithm, values, devices, reduction=reduction)
        expected = np.sum(values, axis=0) / (k if reduction == "mean" else 1)
        for result in out:
            test_util.assert_allclose(result, expected, rtol=1e-6, atol=1e-6)
            np.testing.assert_array_equal(result, out[0])  # bitwise identical everywhere

    @parameterized.parameters(*CPU_ALGORITHMS)
    def test_results_are_built_on_their_devices(self, algorithm):
        devices = test_util.devices(4)
        _, built_on = _graph(ops.all_reduce_algorithm(algorithm), devices, tf.zeros([3, 2]))
        self.assertEqual(built_on, devices)

    @parameterized.parameters(*CPU_ALGORITHMS)
    def test_one_device_is_an_identity(self, algorithm):
        out, _ = _run(algorithm, [np.ones([2], np.float32)], test_util.devices(1))
        self.assertAllEqual(out[0], [1.0, 1.0])

    @parameterized.product(algorithm=["reduce_broadcast", "ring"], wire=["float16", "bfloat16"])
    def test_compressed_transfer_within_its_bound(self, algorithm, wire):
        """Each hop rounds to the wire dtype once: error <= K * u * sum(|x|), u its unit."""
        k = 8
        rng = np.random.default_rng(0)
        values = [rng.normal(size=(64,)).astype(np.float32) for _ in range(k)]
        dtype = tf.as_dtype(wire)
        out, _ = _run(algorithm, values, test_util.devices(k), wire_dtype=dtype)
        unit = {"float16": 2.0**-11, "bfloat16": 2.0**-8}[wire]
        bound = k * unit * np.sum(np.abs(values), axis=0)
        exact = np.sum(np.asarray(values, np.float64), axis=0)
        for result in out:
            self.assertEqual(result.dtype, np.float32)
            self.assertTrue(np.all(np.abs(result - exact) <= bound))
            np.testing.assert_array_equal(result, out[0])
        self.assertGreater(np.max(np.abs(out[0] - exact)), 0)  # it did round

    def test_nccl_graph_on_gpus(self):
        """NCCL kernels exist only for GPUs: check the graph it builds, without running it."""
        devices = [f"/device:GPU:{i}" for i in range(4)]
        graph, built_on = _graph(
            ops.Nccl(), devices, tf.TensorSpec([8], tf.float32), reduction="mean"
        )
        nccl = [op for op in graph.get_operations() if op.type == "NcclAllReduce"]
        self.assertEqual([test_util.local_device(op.device) for op in nccl], devices)
        self.assertEqual({op.get_attr("num_devices") for op in nccl}, {4})
        self.assertEqual({op.get_attr("reduction") for op in nccl}, {b"sum"})
        self.assertLen({op.get_attr("shared_name") for op in nccl}, 1)
        self.assertEqual(built_on, devices)

    def test_nccl_refuses_cpus(self):
        with self.assertRaisesRegex(ValueError, "'nccl' all-reduce runs only on GPUs"):
            ops.Nccl()([tf.ones([2])] * 2, test_util.devices(2))

    def test_auto_chooses_by_device_type_and_size(self):
        auto = ops.Auto(small_bytes=1024)
        gpus = ["/device:GPU:0", "/device:GPU:1"]
        self.assertIsInstance(auto.choose(tf.ones([4]), gpus), ops.Nccl)
        self.assertIsInstance(auto.choose(tf.ones([4]), test_util.devices(2)), ops.ReduceBroadcast)
        self.assertIsInstance(auto.choose(tf.ones([1024]), test_util.devices(2)), ops.Ring)

    def test_collective_needs_tf_function(self):
        with tf.Graph().as_default():
            values = [tf.ones([2]) for _ in range(2)]
            with self.assertRaisesRegex(ValueError, "'collective' all-reduce needs tf.function"):
                ops.Collective()(values, test_util.devices(2))

    def test_bad_arguments(self):
        algorithm = ops.Ring()
        devices = test_util.devices(2)
        with self.assertRaisesRegex(ValueError, "got 2 values and 3 devices"):
            algorithm([tf.ones([2])] * 2, test_util.devices(3))
        with self.assertRaisesRegex(ValueError, r"value 0 is float32\(2,\) and value 1 is "):
            algorithm([tf.ones([2]), tf.ones([3])], devices)
        with self.assertRaisesRegex(ValueError, "`reduction` must be one of"):
            algorithm([tf.ones([2])] * 2, devices, reduction="max")
        with self.assertRaisesRegex(ValueError, "`wire_dtype` must be None, tf.float16"):
            algorithm([tf.ones([2])] * 2, devices, wire_dtype=tf.int8)
        with self.assertRaisesRegex(ValueError, r"one of \('auto'.*got 'hierarchical'"):
            ops.all_reduce_algorithm("hierarchical")

    def test_names_map_to_shared_instances(self):
        self.assertIs(ops.all_reduce_algorithm("ring"), ops.all_reduce_algorithm("ring"))
        mine = ops.Collective(timeout_seconds=5)
        self.assertIs(ops.all_reduce_algorithm(mine), mine)


if __name__ == "__main__":
    tf.test.main()
