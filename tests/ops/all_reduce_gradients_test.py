import gc
import weakref

import numpy as np
import tensorflow as tf
from absl.testing import parameterized

from tests import test_util
from towers import ops

ALGORITHMS = ("reduce_broadcast", "ring", "collective", "hierarchical", "auto", "gather_add")


class _Counting(ops.AllReduce):
    """Counts all-reduces per step and delegates to another algorithm."""

    name = "counting"

    def __init__(self, inner):
        self.inner, self.calls = inner, 0

    def sum(self, values, devices, wire_dtype):
        self.calls += 1
        return self.inner(values, devices, wire_dtype=wire_dtype)


class _TwinWorker(_Counting):
    """A group of twice these devices: another worker, as if it had the same gradients."""

    name = "twin_worker"

    def group_size(self, num_values):
        return 2 * num_values

    def sum(self, values, devices, wire_dtype):
        return [2.0 * v for v in super().sum(values, devices, wire_dtype)]


def _tower_grads(model, full, k, devices):
    """Each tower's gradients of its shard's mean loss, built on its device."""
    grads = []
    for shard, device in zip(ops.split_batch(full, k), devices):
        with tf.device(device):
            with tf.GradientTape() as tape:
                loss, _ = test_util.loss_fn(model)(shard)
            grads.append(tape.gradient(loss, model.trainable_variables))
    return grads


class AllReduceGradientsTest(tf.test.TestCase, parameterized.TestCase):
    def test_graphs_it_built_in_are_freed(self):
        """The notes a compiled update reads (`towers.ops._packed_sum`) go with their graph.
        Before: a table beside the graphs, weakly keyed but holding their tensors, kept every
        graph that all-reduced dense gradients alive for the whole process."""
        devices = test_util.devices(2)
        graphs = []
        for _ in range(3):

            @tf.function
            def reduce(x):
                placed = []
                for device in devices:
                    with tf.device(device):
                        placed.append([x * 2.0])
                graphs.append(weakref.ref(tf.compat.v1.get_default_graph()))
                return ops.all_reduce_gradients(placed, devices, algorithm="gather_add")

            reduce(tf.ones([4]))
            del reduce
        gc.collect()
        self.assertEqual([ref() for ref in graphs], [None] * 3)

    def test_an_algorithm_that_overrides_sum_is_used(self):
        """A subclass of a built-in algorithm that overrides `sum` (here of "auto", which
        picks `gather_add` for two devices) sums every bucket. Before: `sum_terms` took the
        built-in's own terms and skipped it."""

        class Logged(ops.AutoAllReduce):
            calls = 0

            def sum(self, values, devices, wire_dtype):
                Logged.calls += 1
                return super().sum(values, devices, wire_dtype)

        devices = test_util.devices(2)
        grads = [[tf.fill([2**15], float(i + 1))] for i in range(2)]
        out = ops.all_reduce_gradients(grads, devices, algorithm=Logged(small_bytes=1))
        self.assertEqual(Logged.calls, 1)
        self.assertAllEqual(out[1][0], tf.fill([2**15], 1.5))

    def test_negative_weights_are_refused_beyond_these_devices_too(self):
        twin = _TwinWorker(ops.ReduceBroadcastAllReduce())
        grads = [[tf.ones([2])] for _ in range(2)]
        for bucket in (1024, None):
            with self.assertRaisesRegex(
                ValueError, r"`weights` must be non-negative; got \[3, -1\]"
            ):
                ops.all_reduce_gradients(
                    grads,
                    test_util.devices(2),
                    weights=[3, -1],
                    algorithm=twin,
                    bucket_bytes=bucket,
                )
        with self.assertRaisesRegex(ValueError, "`across` must reduce among this process's"):
            ops.HierarchicalAllReduce(across=twin)

    @parameterized.parameters(
        (1024, None, True, 1),  # the weights' total rides in the packed sum
        (None, None, True, 5),  # no packing: all-reduced first, then each of 4 gradients
        (1024, tf.bfloat16, True, 2),  # nor through a narrow wire dtype
        (1024, None, False, 1),  # no weights: the mean over the whole group
    )
    def test_a_group_beyond_these_devices_divides_by_its_total(self, bucket, wire, weigh, calls):
        """A twin worker with the same gradients: the mean is ours, not twice it."""
        model = test_util.Model()
        full = test_util.batch(11 if weigh else 12)  # unweighted: equal shards, one mean
        devices = test_util.devices(3)
        expected, variables = test_util.reference_gradients(model, full)
        twin = _TwinWorker(ops.ReduceBroadcastAllReduce())

        @tf.function
        def reduce(batch):
            return ops.all_reduce_gradients(
                _tower_grads(model, batch, 3, devices),
                devices,
                weights=ops.shard_sizes(batch, 3) if weigh else None,
                algorithm=twin,
                bucket_bytes=bucket,
                wire_dtype=wire,
            )

        reduced = reduce(full)
        self.assertEqual(twin.calls, calls)
        tolerance = dict(rtol=2e-2, atol=2e-3) if wire else dict(rtol=1e-5, atol=1e-6)
        for tower in reduced:
            for got, want in zip(tower, expected):
                if want is None:
                    continue
                self.assertNotIsInstance(got, tf.IndexedSlices)  # dense beyond these devices
                test_util.assert_allclose(got, test_util.dense(want), **tolerance)

    # Every algorithm at every tower count (11 examples: uneven shards), packed in 1 KiB
    # buckets at 3 and 8 towers (the weights ride in the packed sums), unpacked at 2 and 4;
    # but "auto" at 2 and 3 only (for values this small it chooses reduce_broadcast at any
    # count, which runs at all four) and gather_add at 2, 3 and 4 (above two devices it is one
    # sum on the first and copies back, whatever the count).
    @parameterized.parameters(
        *(
            (algorithm, k, 1024 if k in (3, 8) else None)
            for algorithm in ALGORITHMS
            for k in {"auto": (2, 3), "gather_add": (2, 3, 4)}.get(algorithm, (2, 3, 4, 8))
        )
    )
    def test_equals_the_plain_mean_on_every_tower(self, algorithm, k, bucket_bytes):
        model = test_util.Model()
        full = test_util.batch(11)
        devices = test_util.devices(k)
        expected, variables = test_util.reference_gradients(model, full)

        @tf.function
        def reduce(batch):
            tower_grads = _tower_grads(model, batch, k, devices)
            return ops.all_reduce_gradients(
                tower_grads,
                devices,
                weights=ops.shard_sizes(batch, k),
                algorithm=algorithm,
                bucket_bytes=bucket_bytes,
            )

        reduced = reduce(full)
        self.assertLen(reduced, k)
        for tower in reduced:
            for got, want, var in zip(tower, expected, variables):
                if want is None:
                    self.assertIsNone(got)
                    continue
                self.assertEqual(isinstance(got, tf.IndexedSlices), var.name == "embedding:0")
                test_util.assert_allclose(test_util.dense(got), test_util.dense(want))
        for tower in reduced[1:]:
            for got, first in zip(tower, reduced[0]):
                if first is not None:
                    np.testing.assert_array_equal(test_util.dense(got), test_util.dense(first))

    @parameterized.parameters(None, 64)
    def test_a_float64_mean_is_exact_in_float64(self, bucket_bytes):
        rng = np.random.default_rng(0)
        values = [rng.normal(size=(5,)) for _ in range(4)]
        devices = test_util.devices(4)

        @tf.function
        def reduce():
            grads = []
            for value, device in zip(values, devices):
                with tf.device(device):
                    grads.append([tf.constant(value)])
            return ops.all_reduce_gradients(
                grads, devices, weights=[3, 3, 2, 2], bucket_bytes=bucket_bytes
            )

        expected = sum(w * v for w, v in zip([3, 3, 2, 2], values)) / 10
        for (mean,) in reduce():
            np.testing.assert_allclose(mean, expected, rtol=1e-14)

    def test_sparse_rows_arrive_once_and_the_same_on_every_device(self):
        """Repeated rows are summed once, on the first device: GPU kernels add repeated rows
        in a run-dependent order, so each device summing them would set the copies apart
        (seen on the H200's GPU tier: copies of an embedding 6e-8 apart)."""
        model = test_util.Model()
        full = test_util.batch(11)  # 22 ids of 13: repeated within and across towers
        devices = test_util.devices(3)
        expected, variables = test_util.reference_gradients(model, full)
        j = [v.name for v in variables].index("embedding:0")

        @tf.function
        def reduce(batch):
            grads = _tower_grads(model, batch, 3, devices)
            return ops.all_reduce_gradients(grads, devices, weights=ops.shard_sizes(batch, 3))

        embeddings = [tower[j] for tower in reduce(full)]
        first = embeddings[0]
        self.assertLen(np.unique(first.indices), len(first.indices))
        self.assertEqual(first.values.shape[0], len(first.indices))
        for got in embeddings:
            self.assertEqual(
                test_util.local_device(got.values.device),
                test_util.local_device(got.indices.device),
            )
            np.testing.assert_array_equal(got.indices, first.indices)
            np.testing.assert_array_equal(got.values, first.values)
        test_util.assert_allclose(test_util.dense(first), test_util.dense(expected[j]))

    @parameterized.parameters(*ALGORITHMS)
    def test_sparse_gradients_made_dense_on_request(self, algorithm):
        model = test_util.Model()
        full = test_util.batch(8)
        devices = test_util.devices(4)
        expected, _ = test_util.reference_gradients(model, full)

        @tf.function
        def reduce(batch):
            return ops.all_reduce_gradients(
                _tower_grads(model, batch, 4, devices), devices, algorithm=algorithm, sparse="dense"
            )

        embedding = reduce(full)[2][0]
        self.assertIsInstance(embedding, tf.Tensor)
        test_util.assert_allclose(embedding, test_util.dense(expected[0]))

    def test_sparse_gradients_made_dense_are_packed(self):
        """Packing needs static shapes: rows made dense take their variable's. Before, slices
        whose dense shape is known only when the step runs (a Keras Embedding's, in the
        models suite) refused to build with `Replicated(sparse="dense")` and its default
        buckets: "Packing needs static shapes; tensor #0 has shape (None, 768)"."""
        devices = test_util.devices(2)
        table, bias = tf.Variable(tf.zeros([4, 2])), tf.Variable(tf.zeros([3]))

        @tf.function(input_signature=[tf.TensorSpec([None, 2])])
        def reduce(like):
            grads = []
            for i, device in enumerate(devices):
                with tf.device(device):
                    rows = tf.IndexedSlices(
                        tf.fill([3, 2], float(i + 1)), tf.constant([0, 2, 2]), tf.shape(like)
                    )
                    grads.append([rows, tf.fill([3], float(i + 1))])
            return ops.all_reduce_gradients(
                grads, devices, sparse="dense", bucket_bytes=2**20, variables=[table, bias]
            )

        want_rows = [[1.5, 1.5], [0, 0], [3, 3], [0, 0]]  # the mean, repeated rows summed
        for rows, bias_grad in reduce(tf.zeros([4, 2])):
            self.assertIsInstance(rows, tf.Tensor)
            self.assertAllClose(rows, want_rows)
            self.assertAllClose(bias_grad, [1.5] * 3)

    def test_packing_bounds_the_number_of_all_reduces(self):
        """100 variables: at most 4 all-reduces per step with packing, 100 without."""
        grads = [[tf.ones([32, 32]) if i % 2 else tf.ones([32]) for i in range(100)]] * 4
        devices = test_util.devices(4)
        packed, unpacked = _Counting(ops.RingAllReduce()), _Counting(ops.RingAllReduce())
        ops.all_reduce_gradients(grads, devices, algorithm=packed)
        ops.all_reduce_gradients(grads, devices, algorithm=unpacked, bucket_bytes=None)
        self.assertLessEqual(packed.calls, 4)
        self.assertEqual(unpacked.calls, 100)

    def test_packed_collectives_in_the_graph(self):
        devices = test_util.devices(4)

        @tf.function
        def reduce(x):
            grads = []
            for device in devices:
                with tf.device(device):
                    grads.append([x[: i + 1] * 2.0 for i in range(100)])
            return ops.all_reduce_gradients(grads, devices, algorithm="collective")

        graph = reduce.get_concrete_function(tf.zeros([100])).graph
        collectives = [
            test_util.local_device(op.device)
            for op in graph.get_operations()
            if op.type == "CollectiveReduceV2"
        ]
        for device in devices:
            self.assertBetween(collectives.count(device), 1, 4)

    @parameterized.parameters(tf.float16, tf.bfloat16)
    def test_compressed_transfer_stays_close_to_the_mean(self, wire):
        rng = np.random.default_rng(1)
        grads = [[tf.constant(rng.normal(size=(50,)), tf.float32)] for _ in range(4)]
        exact = np.mean([g[0].numpy() for g in grads], axis=0)
        reduced = ops.all_reduce_gradients(
            grads, test_util.devices(4), algorithm="ring", wire_dtype=wire
        )
        unit = 2.0**-11 if wire == tf.float16 else 2.0**-8
        bound = 4 * unit * np.mean([np.abs(g[0].numpy()) for g in grads], axis=0)
        self.assertTrue(np.all(np.abs(reduced[0][0].numpy() - exact) <= bound))

    @parameterized.product(
        algorithm=["reduce_broadcast", "ring", "collective"], mean=[3e4, 6.5e4], equal=[True, False]
    )
    def test_half_precision_transfer_overflows_only_where_the_mean_does(
        self, algorithm, mean, equal
    ):
        """4 towers of 3e4 used to arrive as inf: the sum was cast, not the mean."""
        devices = test_util.devices(4)
        weights = [1, 1, 1, 1] if equal else [3, 2, 2, 1]
        grads = [[tf.fill([16], mean)] for _ in devices]

        @tf.function
        def reduce():
            return ops.all_reduce_gradients(
                grads, devices, weights=weights, algorithm=algorithm, wire_dtype=tf.float16
            )

        bound = 4 * 2.0**-11 * mean  # K * u * sum_i |w_i g_i|
        for tower in reduce():
            self.assertTrue(np.all(np.isfinite(tower[0].numpy())))
            self.assertAllClose(tower[0], np.full([16], mean), rtol=0, atol=bound)

    @parameterized.parameters("reduce_broadcast", "ring")
    def test_half_precision_transfer_at_both_ends_of_its_bound(self, algorithm):
        """K * (u * S + m) per element; finite up to 65504 / (1 + u)**K (65376 at K = 4)."""
        devices = test_util.devices(4)
        u, m = 2.0**-11, 2.0**-25
        rng = np.random.default_rng(0)
        for scale in (1e-8, 1.0, 65300 / 4):
            values = [rng.uniform(0.5, 1.0, size=(64,)).astype(np.float32) * scale for _ in devices]
            values[-1] = np.float32(scale * 4) - sum(values[:-1])  # the mean is `scale` exactly
            grads = [[tf.constant(v)] for v in values]
            reduced = ops.all_reduce_gradients(
                grads, devices, algorithm=algorithm, wire_dtype=tf.float16
            )
            exact = np.mean(np.asarray(values, np.float64), axis=0)
            total = np.sum(np.abs(np.asarray(values, np.float64)) / 4, axis=0)
            error = np.abs(reduced[0][0].numpy() - exact)
            self.assertTrue(np.all(error <= 4 * (u * total + m)), f"scale {scale}: {error.max()}")

    def test_a_mean_beyond_the_wire_dtype_overflows_as_documented(self):
        grads = [[tf.fill([4], 7e4)] for _ in range(2)]
        reduced = ops.all_reduce_gradients(
            grads, test_util.devices(2), algorithm="ring", wire_dtype=tf.float16
        )
        self.assertTrue(np.all(np.isinf(reduced[0][0].numpy())))

    def test_options_are_checked(self):
        grads = [[tf.ones([2])]] * 2
        devices = test_util.devices(2)
        for kwargs, message in [
            ({"bucket_bytes": 0}, "`bucket_bytes` must be an int >= 1 or None; got 0"),
            ({"wire_dtype": tf.int8}, "`wire_dtype` must be None, tf.float16 or tf.bfloat16"),
            ({"sparse": "bogus"}, r"`sparse` must be one of \('gather', 'dense'\); got 'bogus'"),
        ]:
            with self.assertRaisesRegex(ValueError, message):
                ops.all_reduce_gradients(grads, devices, **kwargs)

    @parameterized.parameters(
        (None, "auto", None),
        ([5], "ring", 64),
        (None, "gather_add", 4 * 2**20),
        ([5], "auto", None),
    )
    def test_one_tower_gets_its_own_gradients_with_nothing_packed_or_sent(
        self, weights, algorithm, bucket_bytes
    ):
        """One tower's mean is its gradient: nothing is packed, sent or cast (a pass over every
        gradient an uncompiled step on one GPU spent for nothing), the bits unchanged."""
        devices = test_util.devices(1)
        counting = _Counting(ops.all_reduce_algorithm(algorithm))
        values = [np.float32([[1.5, -2.0], [3.0, 1e-30]]), np.float16([65504.0, 1e-7])]

        @tf.function
        def reduce():
            with tf.device(devices[0]):
                grads = [tf.constant(v) for v in values]
                grads.append(tf.IndexedSlices(tf.ones([2, 2]), tf.constant([0, 0]), [3, 2]))
            return ops.all_reduce_gradients(
                [grads],
                devices,
                weights=None if weights is None else [tf.constant(w) for w in weights],
                algorithm=counting,
                bucket_bytes=bucket_bytes,
                sparse="dense",
            )

        graph = reduce.get_concrete_function().graph
        (reduced,) = reduce()
        self.assertEqual(counting.calls, 0)
        packed = [op.type for op in graph.get_operations() if op.type in ("ConcatV2", "Split")]
        self.assertEqual(packed, [])
        if weights is None:  # (a shard size's share is a tensor: x * 1 in float32)
            casts = [op for op in graph.get_operations() if op.type == "Cast"]
            self.assertEqual([op.name for op in casts], [])
        np.testing.assert_array_equal(reduced[0], values[0])
        self.assertEqual(reduced[1].dtype, tf.float16)
        np.testing.assert_array_equal(reduced[1], values[1])
        np.testing.assert_array_equal(reduced[2], [[2.0, 2.0], [0.0, 0.0], [0.0, 0.0]])

    def test_one_towers_gradient_is_on_its_device_and_copied_only_from_elsewhere(self):
        here, there = test_util.devices(2)
        with tf.Graph().as_default():
            with tf.device(here):
                grads = [tf.constant([1.0, 2.0]), tf.constant([3.0])]
            (kept,) = ops.all_reduce_gradients([grads], [here])
            (moved,) = ops.all_reduce_gradients([grads], [there])
        self.assertIs(kept[0], grads[0])
        self.assertIs(kept[1], grads[1])
        for value in moved:
            self.assertEqual(test_util.local_device(value.device), test_util.local_device(there))
            self.assertEqual(value.op.type, "Identity")

    def test_half_precision_gradients_keep_their_dtype(self):
        grads = [[tf.constant([60000.0], tf.float16)]] * 2
        reduced = ops.all_reduce_gradients(grads, test_util.devices(2), algorithm="ring")
        self.assertEqual(reduced[1][0].dtype, tf.float16)
        self.assertAllClose(tf.cast(reduced[1][0], tf.float32), [60000.0])

    def test_errors(self):
        devices = test_util.devices(2)
        with self.assertRaisesRegex(ValueError, "got 3 devices for 2 towers"):
            ops.all_reduce_gradients([[None]] * 2, test_util.devices(3))
        with self.assertRaisesRegex(ValueError, r"variable #0 is None in towers \[1\]"):
            ops.all_reduce_gradients([[tf.ones([1])], [None]], devices)
        with self.assertRaisesRegex(ValueError, "`sparse` must be one of"):
            ops.all_reduce_gradients([[None]] * 2, devices, sparse="drop")
        self.assertEqual(ops.all_reduce_gradients([[None]] * 2, devices), [[None], [None]])


if __name__ == "__main__":
    tf.test.main()
