import numpy as np
import tensorflow as tf
from absl.testing import parameterized

from tests import test_util
from towers import ops


def _slices(values, indices, rows=5):
    return tf.IndexedSlices(
        tf.constant(values, tf.float32), tf.constant(indices), tf.constant([rows, 2])
    )


class AverageGradientsTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.product(k=[1, 2, 3, 4, 8], batch=[8, 11, 24])
    def test_equals_the_single_device_gradient(self, k, batch):
        """Weighted by shard size, per-shard gradients average to the whole batch's gradient."""
        model = test_util.Model()
        full = test_util.batch(batch)
        expected, variables = test_util.reference_gradients(model, full)
        tower_grads = []
        for shard in ops.split_batch(full, k):
            with tf.GradientTape() as tape:
                loss, _ = test_util.loss_fn(model)(shard)
            tower_grads.append(tape.gradient(loss, variables))
        averaged = ops.average_gradients(tower_grads, ops.shard_sizes(full, k))
        for got, want, var in zip(averaged, expected, variables):
            if var.name.startswith("unused"):
                self.assertIsNone(got)
                continue
            self.assertEqual(isinstance(got, tf.IndexedSlices), var.name.startswith("embedding"))
            test_util.assert_allclose(test_util.dense(got), test_util.dense(want))

    @parameterized.product(k=[2, 3, 8], bucket_bytes=[64, 4 << 20])
    def test_packed_equals_unpacked(self, k, bucket_bytes):
        """Towers send packed buffers per variable device: the same values, in fewer tensors."""
        model = test_util.Model()
        full = test_util.batch(11)
        expected, variables = test_util.reference_gradients(model, full)
        devices = test_util.devices(k)

        @tf.function
        def average(batch, packed):
            tower_grads = []
            for shard, device in zip(ops.split_batch(batch, k), devices):
                with tf.device(device), tf.GradientTape() as tape:
                    loss, _ = test_util.loss_fn(model)(shard)
                    tower_grads.append(tape.gradient(loss, variables))
            return ops.average_gradients(
                tower_grads, ops.shard_sizes(batch, k), variables=variables,
                bucket_bytes=bucket_bytes if packed else None,
            )  # fmt: skip

        packed, plain = average(full, True), average(full, False)
        for got, same, want, var in zip(packed, plain, expected, variables):
            if var.name.startswith("unused"):
                self.assertIsNone(got)
                continue
            self.assertEqual(isinstance(got, tf.IndexedSlices), var.name.startswith("embedding"))
            # The same operations, at other offsets: AddN may round the last bit otherwise.
            test_util.assert_allclose(test_util.dense(got), test_util.dense(same), rtol=1e-6)
            test_util.assert_allclose(test_util.dense(got), test_util.dense(want))
        graph = average.get_concrete_function(full, True).graph
        concats = [op for op in graph.get_operations() if op.type == "ConcatV2"]
        towers_packing = {test_util.local_device(op.device) for op in concats}
        self.assertTrue(set(devices[1:]) <= towers_packing, towers_packing)  # on each tower

    def test_a_tower_packs_where_most_of_its_gradients_are(self):
        with tf.device("/cpu:3"):
            variables = [tf.Variable(tf.zeros([2])) for _ in range(3)]

        @tf.function
        def average(x):
            grads = []
            for first, rest in (("/cpu:2", "/cpu:1"), ("/cpu:4", "/cpu:5")):
                with tf.device(first):  # e.g. a custom gradient placed elsewhere
                    tower = [x * 2.0]
                with tf.device(rest):
                    tower += [x * 3.0, x * 4.0]
                grads.append(tower)
            return ops.average_gradients(grads, variables=variables, bucket_bytes=1024)

        graph = average.get_concrete_function(tf.TensorSpec([2])).graph
        concats = {
            test_util.local_device(op.device)
            for op in graph.get_operations()
            if op.type == "ConcatV2"
        }
        self.assertEqual(concats, {"/device:CPU:1", "/device:CPU:5"})
        got = average(tf.constant([1.0, 2.0]))
        for value, factor in zip(got, (2.0, 3.0, 4.0)):
            self.assertAllClose(value, [factor, 2 * factor])

    def test_packed_half_precision_crosses_as_half_and_sums_on_the_variable_device(self):
        with tf.device("/cpu:3"):
            var = tf.Variable(tf.zeros([2], tf.float16))
            other = tf.Variable(tf.zeros([3]))

        @tf.function
        def average(a, b):
            grads = []
            for value, device in ((a, "/cpu:1"), (b, "/cpu:2")):
                with tf.device(device):
                    grads.append([value * 2.0, tf.ones([3])])
            grads.append([a, tf.ones([3])])  # a tower that names no device: packs on CPU:3
            return ops.average_gradients(grads, [1, 2, 1], variables=[var, other], bucket_bytes=64)

        spec = tf.TensorSpec([2], tf.float16)
        graph = average.get_concrete_function(spec, spec).graph
        ops_on = {}
        for op in graph.get_operations():
            ops_on.setdefault(test_util.local_device(op.device), []).append(op)
        widened = [  # float16 made float32: only where the sum is, after crossing
            device
            for device, found in ops_on.items()
            for op in found
            if op.type == "Cast" and op.inputs[0].dtype == tf.float16
        ]
        self.assertEqual(set(widened), {"/device:CPU:3"})
        crossing = {
            test_util.local_device(op.inputs[0].op.device)
            for op in ops_on["/device:CPU:3"]
            if op.type == "Cast" and op.inputs[0].dtype == tf.float16
        }
        self.assertTrue({"/device:CPU:1", "/device:CPU:2"} <= crossing, crossing)
        adds = {
            test_util.local_device(op.device) for op in graph.get_operations() if op.type == "AddN"
        }
        self.assertEqual(adds, {"/device:CPU:3"})
        got = average(tf.constant([1.0, 2.0], tf.float16), tf.constant([3.0, 4.0], tf.float16))
        self.assertAllClose(tf.cast(got[0], tf.float32), [(2 + 12 + 1) / 4, (4 + 16 + 2) / 4])
        self.assertAllClose(got[1], [1.0, 1.0, 1.0])

    def test_packed_half_precision_and_bad_bucket_bytes(self):
        with tf.device("/cpu:2"):
            var = tf.Variable(tf.zeros([2], tf.float16))
        grads = [
            [tf.constant([60000.0, 1.0], tf.float16)],
            [tf.constant([60000.0, 2.0], tf.float16)],
        ]
        got = ops.average_gradients(grads, [1, 1], variables=[var], bucket_bytes=1024)[0]
        self.assertEqual(got.dtype, tf.float16)
        self.assertAllClose(tf.cast(got, tf.float32), [60000.0, 1.5], rtol=1e-2)
        for bad, error in ((0, ValueError), (-1, ValueError), (1.5, TypeError), ("4MB", TypeError)):
            with self.assertRaisesRegex(error, "`bucket_bytes` must be an int >= 1 or None"):
                ops.average_gradients(grads, variables=[var], bucket_bytes=bad)

    def test_plain_mean(self):
        grads = [[tf.constant([1.0, 2.0])], [tf.constant([3.0, 6.0])]]
        self.assertAllClose(ops.average_gradients(grads)[0], [2.0, 4.0])

    def test_one_tower_is_the_identity(self):
        grad = tf.constant([1.0])
        self.assertIs(ops.average_gradients([[grad, None]])[0], grad)

    @parameterized.parameters(None, 64)
    def test_a_float64_mean_is_exact_in_float64(self, bucket_bytes):
        """Shard sizes 3, 3, 2, 2 weigh 0.3 and 0.2: as float32 constants, 4e-8 off."""
        rng = np.random.default_rng(0)
        values = [rng.normal(size=(5,)) for _ in range(4)]
        weights = [3, 3, 2, 2]
        variables = [tf.Variable(np.zeros(5)), tf.Variable(np.zeros(1))]
        grads = [[tf.constant(v), tf.constant(v[:1])] for v in values]
        dynamic = [tf.constant(w) for w in weights]  # a batch size known at run time
        expected = sum(w * v for w, v in zip(weights, values)) / 10
        for given in (weights, dynamic):
            mean, _ = ops.average_gradients(
                grads, weights=given, variables=variables, bucket_bytes=bucket_bytes
            )
            self.assertEqual(mean.dtype, tf.float64)
            np.testing.assert_allclose(mean, expected, rtol=1e-14)

    def test_weights_are_normalized(self):
        grads = [[tf.constant(1.0)], [tf.constant(4.0)]]
        self.assertAllClose(ops.average_gradients(grads, weights=[3, 1])[0], 1.75)

    def test_sparse_stays_sparse(self):
        grads = [[_slices([[1.0, 1.0]], [0])], [_slices([[2.0, 2.0], [4.0, 4.0]], [0, 3])]]
        got = ops.average_gradients(grads, weights=[1, 3])[0]
        self.assertIsInstance(got, tf.IndexedSlices)
        self.assertAllEqual(got.indices, [0, 0, 3])
        self.assertAllClose(got.values, [[0.25, 0.25], [1.5, 1.5], [3.0, 3.0]])
        self.assertAllEqual(got.dense_shape, [5, 2])

    def test_sparse_and_dense_become_dense(self):
        grads = [[_slices([[2.0, 2.0]], [1])], [tf.ones([5, 2])]]
        got = ops.average_gradients(grads)[0]
        self.assertIsInstance(got, tf.Tensor)
        expected = np.full([5, 2], 0.5)
        expected[1] += 1.0
        self.assertAllClose(got, expected)

    @parameterized.parameters(tf.float16, tf.bfloat16)
    def test_half_precision_accumulates_in_float32(self, dtype):
        # 60000 + 60000 overflows float16; the mean of the two does not.
        grads = [[tf.constant([60000.0, 1.0], dtype)], [tf.constant([60000.0, 2.0], dtype)]]
        got = ops.average_gradients(grads)[0]
        self.assertEqual(got.dtype, dtype)
        self.assertTrue(np.all(np.isfinite(tf.cast(got, tf.float32))))
        self.assertAllClose(tf.cast(got, tf.float32), [60000.0, 1.5], rtol=1e-2)
        sparse = [[tf.IndexedSlices(tf.constant([[60000.0]], dtype), tf.constant([0]))]] * 2
        self.assertEqual(ops.average_gradients(sparse)[0].values.dtype, dtype)

    def test_none_everywhere_stays_none(self):
        self.assertEqual(ops.average_gradients([[None], [None], [None]]), [None])

    def test_none_in_some_towers_names_variable_and_towers(self):
        var = tf.Variable([1.0], name="layer_w")
        grads = [[tf.ones([1])], [None], [tf.ones([1])], [None]]
        with self.assertRaisesRegex(ValueError, r"variable layer_w:0 is None in towers \[1, 3\]"):
            ops.average_gradients(grads, variables=[var])
        with self.assertRaisesRegex(ValueError, r"variable #0 is None in towers \[1, 3\]"):
            ops.average_gradients(grads)

    def test_towers_disagree_on_number_of_variables(self):
        with self.assertRaisesRegex(ValueError, "tower 0 has 2 and tower 1 has 1"):
            ops.average_gradients([[tf.ones([1]), None], [tf.ones([1])]])

    def test_variables_length_mismatch(self):
        with self.assertRaisesRegex(ValueError, "match the 1 gradients per tower; got 2"):
            ops.average_gradients([[tf.ones([1])]], variables=[tf.Variable(1.0)] * 2)

    def test_bad_gradient_type(self):
        with self.assertRaisesRegex(TypeError, "variable #0 has list in tower 1"):
            ops.average_gradients([[tf.ones([1])], [[1.0]]])

    def test_no_towers(self):
        with self.assertRaisesRegex(ValueError, "at least one tower"):
            ops.average_gradients([])

    def test_averages_are_built_where_the_variables_live(self):
        with tf.device("/cpu:6"):
            var = tf.Variable(tf.zeros([2]))

        @tf.function
        def average(a, b):
            with tf.device("/cpu:1"):
                return ops.average_gradients([[a], [b]], variables=[var])

        graph = average.get_concrete_function(tf.zeros([2]), tf.zeros([2])).graph
        add = [op for op in graph.get_operations() if op.type == "AddN"]
        self.assertLen(add, 1)
        self.assertIn("CPU:6", add[0].device)


if __name__ == "__main__":
    tf.test.main()
