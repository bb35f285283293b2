"""The all-reduce contract, run against every algorithm (and a custom one built through it)."""

import functools
from unittest import mock

import numpy as np
import tensorflow as tf
from absl.testing import parameterized

import towers
from tests import test_util
from towers import ops
from towers.ops import _sparse_mode, internal
from towers.ops._all_reduce import nccl

CPU_ALGORITHMS = (
    "reduce_broadcast",
    "ring",
    "collective",
    "hierarchical",
    "auto",
    "gather_add",
    "add_everywhere",
)


class AddEverywhere(ops.AllReduce):
    """A custom algorithm written against the public contract: every device adds all values.

    In float64, so that every device's sum is the same bits whatever order its kernel adds
    in (the tests' few float32 values add exactly in float64): on the H200 one device's
    float32 `AddN` came out 1 ulp from the others' in 1 run of 3.
    """

    name = "add_everywhere"

    def sum(self, values, devices, wire_dtype):
        dtype = values[0].dtype
        sent = [v if wire_dtype is None else tf.cast(v, wire_dtype) for v in values]
        wide = tf.float64 if dtype.is_floating else dtype
        out = []
        for device in devices:
            with tf.device(device):
                total = tf.add_n([tf.cast(tf.identity(v), wide) for v in sent])
                out.append(tf.cast(total, dtype))
        return out


def _physical_gpus(physical):
    """As if logical GPU i lived on physical GPU `physical[i]` (this machine may have none)."""
    return mock.patch.object(nccl, "physical_gpu_of_logical", return_value=physical)


def _algorithm(name):
    return AddEverywhere() if name == "add_everywhere" else ops.all_reduce_algorithm(name)


def _placed(tensors, devices):
    """Tensor i copied onto `devices[i]`."""
    placed = []
    for tensor, device in zip(tensors, devices):
        with tf.device(device):
            placed.append(tf.identity(tensor))
    return placed


def _run(algorithm, values, devices, **kwargs):
    """All-reduces numpy `values` placed on `devices` inside a tf.function."""

    @tf.function
    def reduce(*tensors):
        out = algorithm(_placed(tensors, devices), devices, **kwargs)
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
        out, _ = _run(_algorithm(algorithm), values, devices, reduction=reduction)
        expected = np.sum(np.asarray(values, np.float64), axis=0) / (
            k if reduction == "mean" else 1
        )
        for result in out:
            test_util.assert_allclose(result, expected, rtol=1e-5, atol=1e-6)
            np.testing.assert_array_equal(result, out[0])  # bitwise identical everywhere

    @parameterized.product(algorithm=CPU_ALGORITHMS, k=[2, 3])
    def test_sum_terms_add_up_to_the_sum_on_every_device(self, algorithm, k):
        """`sum_terms`: each device's terms, on it, whose in-order sum is the all-reduce's
        (bitwise equal everywhere); `gather_add` gives both values on two devices, the others
        (and `gather_add` on three) the sum."""
        values = [np.full([3], 0.1 * (i + 1), np.float32) for i in range(k)]
        devices = test_util.devices(k)

        @tf.function
        def terms(*tensors):
            out = _algorithm(algorithm).sum_terms(_placed(tensors, devices), devices)
            self.assertEqual(
                [{test_util.local_device(t.device) for t in ts} for ts in out],
                [{d} for d in devices],
            )
            return [len(ts) for ts in out], [functools.reduce(tf.add, ts) for ts in out]

        counts, sums = terms(*[tf.constant(v) for v in values])
        self.assertEqual(
            [int(c) for c in counts], [2 if algorithm == "gather_add" and k == 2 else 1] * k
        )
        for total in sums:
            test_util.assert_allclose(total, np.sum(values, axis=0), rtol=1e-6)
            np.testing.assert_array_equal(total, sums[0])

    @parameterized.parameters(*CPU_ALGORITHMS)
    def test_results_are_built_on_their_devices(self, algorithm):
        devices = test_util.devices(4)
        _, built_on = _graph(_algorithm(algorithm), devices, tf.zeros([3, 2]))
        self.assertEqual(built_on, devices)

    @parameterized.parameters(*CPU_ALGORITHMS)
    def test_one_device_is_an_identity(self, algorithm):
        out, _ = _run(_algorithm(algorithm), [np.ones([2], np.float32)], test_util.devices(1))
        self.assertAllEqual(out[0], [1.0, 1.0])

    @parameterized.product(
        algorithm=["reduce_broadcast", "ring", "hierarchical", "add_everywhere"],
        wire=["float16", "bfloat16"],
    )
    def test_compressed_transfer_within_its_bound(self, algorithm, wire):
        """Each hop rounds to the wire dtype once: error <= K * u * sum(|x|), u its unit."""
        k = 8
        rng = np.random.default_rng(0)
        values = [rng.normal(size=(64,)).astype(np.float32) for _ in range(k)]
        dtype = tf.as_dtype(wire)
        out, _ = _run(_algorithm(algorithm), values, test_util.devices(k), wire_dtype=dtype)
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
        with _physical_gpus([0, 1, 2, 3]):
            graph, built_on = _graph(
                ops.NcclAllReduce(), devices, tf.TensorSpec([8], tf.float32), reduction="mean"
            )
        nccl = [op for op in graph.get_operations() if op.type == "NcclAllReduce"]
        self.assertEqual([test_util.local_device(op.device) for op in nccl], devices)
        self.assertEqual({op.get_attr("num_devices") for op in nccl}, {4})
        self.assertEqual({op.get_attr("reduction") for op in nccl}, {b"sum"})
        self.assertLen({op.get_attr("shared_name") for op in nccl}, 1)
        self.assertEqual(built_on, devices)

    def test_nccl_instances_never_share_names(self):
        devices = [f"/device:GPU:{i}" for i in range(2)]
        names = set()
        for algorithm in (ops.NcclAllReduce(), ops.NcclAllReduce()):
            for _ in range(2):
                with _physical_gpus([0, 1]):
                    graph, _ = _graph(algorithm, devices, tf.TensorSpec([8], tf.float32))
                ops_ = [op for op in graph.get_operations() if op.type == "NcclAllReduce"]
                names |= {op.get_attr("shared_name") for op in ops_}
        self.assertLen(names, 4)

    def test_nccl_refuses_cpus(self):
        with self.assertRaisesRegex(ValueError, "'nccl' all-reduce runs only on GPUs"):
            ops.NcclAllReduce()([tf.ones([2])] * 2, ["/device:CPU:0", "/device:CPU:0"])

    def test_nccl_refuses_logical_gpus_of_one_gpu(self):
        """NCCL runs one rank per physical GPU: two logical GPUs of one would fail at run time."""
        with _physical_gpus([0, 0, 1, 1]):
            message = r"'/device:GPU:0' and '/device:GPU:1' are logical devices of the same phys"
            with self.assertRaisesRegex(ValueError, message):
                _graph(ops.NcclAllReduce(), ["/device:GPU:0", "/device:GPU:1"], tf.zeros([2]))
            gpus = ["/device:GPU:1", "/device:GPU:2"]
            graph, _ = _graph(ops.NcclAllReduce(), gpus, tf.zeros([2]))
        self.assertLen([op for op in graph.get_operations() if op.type == "NcclAllReduce"], 2)

    def test_logical_gpus_are_numbered_through_the_physical_ones(self):
        physical = nccl.physical_gpu_of_logical()
        self.assertEqual(physical, [0] * test_util.NUM_DEVICES if test_util.KIND == "GPU" else [])

    def test_auto_chooses_by_devices_and_size(self):
        auto = ops.AutoAllReduce(small_bytes=1024)
        gpus = ["/device:GPU:0", "/device:GPU:1"]
        cpus = test_util.devices(2)
        with _physical_gpus([0, 1]):
            self.assertIsInstance(auto.choose(tf.ones([4]), gpus), ops.NcclAllReduce)
        with _physical_gpus([0, 0]):  # one GPU split in two: by size, as on CPUs
            self.assertIsInstance(auto.choose(tf.ones([4]), gpus), ops.ReduceBroadcastAllReduce)
            self.assertIsInstance(auto.choose(tf.ones([1024]), gpus), ops.GatherAddAllReduce)
            self.assertIsInstance(auto.choose(tf.ones([1024]), gpus * 2), ops.RingAllReduce)
        self.assertIsInstance(auto.choose(tf.ones([4]), cpus), ops.ReduceBroadcastAllReduce)
        self.assertIsInstance(auto.choose(tf.ones([1024]), cpus), ops.GatherAddAllReduce)
        self.assertIsInstance(auto.choose(tf.ones([1024]), test_util.devices(3)), ops.RingAllReduce)

    def test_replicated_sends_tables_dense_within_one_split_gpu(self):
        """`Replicated(sparse="auto")`: dense where every device is a logical GPU of one GPU,
        one GPU alone included (a copy in its memory costs less than the host round trip of
        summing rows once, and the guard's pass over the table beside rows), rows gathered
        elsewhere (GPUs of their own, CPUs, one CPU)."""
        gpus = ["/device:GPU:0", "/device:GPU:1", "/device:GPU:2", "/device:GPU:3"]
        for physical, want in (
            ([0, 0, 0, 0], "dense"),
            ([0], "dense"),
            ([0, 0, 1, 1], "gather"),
            ([0, 1], "gather"),
        ):
            with mock.patch.object(_sparse_mode, "physical_gpu_of_logical", return_value=physical):
                self.assertEqual(internal.sparse_mode("auto", gpus[: len(physical)]), want)
                self.assertEqual(internal.sparse_mode("gather", gpus[:2]), "gather")
        cpus = ["/device:CPU:0", "/device:CPU:1"]  # (the GPU tier's devices are split GPUs)
        self.assertEqual(internal.sparse_mode("auto", cpus), "gather")
        self.assertEqual(internal.sparse_mode("auto", cpus[:1]), "gather")
        self.assertEqual(internal.sparse_mode("dense", cpus), "dense")
        with self.assertRaisesRegex(
            ValueError, r"one of \('auto', 'gather', 'dense'\); got 'rows'"
        ):
            internal.sparse_mode("rows", gpus)

    @parameterized.parameters((8, None, [4, 4]), (8, 3, [3, 3, 2]), (5, None, [3, 2]), (2, 4, [2]))
    def test_hierarchical_reduces_within_groups_and_across_leaders(self, k, size, groups):
        """Only group leaders exchange values between groups; other devices stay in theirs."""
        algorithm = ops.HierarchicalAllReduce(size)
        devices = test_util.devices(k)
        self.assertEqual([len(g) for g in algorithm.groups(devices)], groups)
        group_of = {d: i for i, g in enumerate(algorithm.groups(devices)) for d in g}
        leaders = {g[0] for g in algorithm.groups(devices)}
        graph, _ = _graph(algorithm, devices, tf.TensorSpec([6], tf.float32))
        index = {d: i for i, d in enumerate(devices)}
        crossings = set()
        for op in graph.get_operations():
            for tensor in op.inputs:
                a, b = (index.get(test_util.local_device(o.device)) for o in (tensor.op, op))
                if a is not None and b is not None and group_of[a] != group_of[b]:
                    crossings.add((a, b))
        self.assertTrue(all(a in leaders and b in leaders for a, b in crossings), crossings)
        self.assertEqual(bool(crossings), len(groups) > 1)
        values = [np.full([6], i + 1.0, np.float32) for i in range(k)]
        for result in _run(algorithm, values, devices)[0]:
            self.assertAllEqual(result, np.full([6], k * (k + 1) / 2))

    def test_hierarchical_across_collective(self):
        algorithm = ops.HierarchicalAllReduce(2, across="collective")
        values = [np.full([3], i, np.float32) for i in range(6)]
        for result in _run(algorithm, values, test_util.devices(6))[0]:
            self.assertAllEqual(result, [15.0, 15.0, 15.0])

    def test_collective_is_refused_eagerly(self):
        message = r"'collective' all-reduce must be built inside tf.function \(or a v1 graph\)"
        with self.assertRaisesRegex(ValueError, message):  # eagerly: refused, not a hang
            ops.CollectiveAllReduce()([tf.ones([2])] * 2, test_util.devices(2))

    def test_collective_refuses_repeated_devices(self):
        devices = ["/device:CPU:1", "/device:CPU:1"]

        @tf.function
        def reduce(x):
            return ops.CollectiveAllReduce()([x, x * 2.0], devices)

        with self.assertRaisesRegex(ValueError, "needs distinct devices, one value each"):
            reduce.get_concrete_function(tf.TensorSpec([2]))

    def test_collectives_of_several_instances_share_one_order_per_device(self):
        """Two models' all-reduces in one step (a GAN, say) must not start in different orders."""
        devices = test_util.devices(2)
        first, second = ops.CollectiveAllReduce(), ops.CollectiveAllReduce()

        @tf.function
        def reduce(x):
            placed = []
            for device in devices:
                with tf.device(device):
                    placed.append(x * 2.0)
            return first(placed, devices), second(placed, devices), first(placed, devices)

        graph = reduce.get_concrete_function(tf.TensorSpec([3])).graph
        for device in devices:
            chain = [
                op
                for op in graph.get_operations()
                if op.type == "CollectiveReduceV2" and test_util.local_device(op.device) == device
            ]
            self.assertLen(chain, 3)
            for before, after in zip(chain, chain[1:]):
                self.assertIn(before, after.control_inputs)

    def test_collectives_are_ordered_per_device(self):
        """Three all-reduces in one function: each device's collectives form a chain."""
        devices = test_util.devices(2)
        algorithm = ops.CollectiveAllReduce()

        @tf.function
        def reduce(x):
            placed = []
            for device in devices:
                with tf.device(device):
                    placed.append(x * 2.0)
            return [algorithm(placed, devices) for _ in range(3)]

        graph = reduce.get_concrete_function(tf.TensorSpec([3])).graph
        for device in devices:
            chain = [
                op
                for op in graph.get_operations()
                if op.type == "CollectiveReduceV2" and test_util.local_device(op.device) == device
            ]
            self.assertLen(chain, 3)
            for before, after in zip(chain, chain[1:]):
                self.assertIn(before, after.control_inputs)
        collectives = [op for op in graph.get_operations() if op.type == "CollectiveReduceV2"]
        instance_keys = [int(tf.get_static_value(op.inputs[3])) for op in collectives]
        self.assertEqual(sorted(instance_keys), [1, 1, 2, 2, 3, 3])

    def test_collectives_in_a_v1_graph_chain_within_their_block(self):
        """Each `collective_order` block is a unit run alone: no wait on another block."""
        devices = test_util.devices(2)
        with tf.Graph().as_default() as graph:
            algorithm = ops.CollectiveAllReduce()
            values = []
            for i, device in enumerate(devices):
                with tf.device(device):
                    values.append(tf.constant([float(i + 1)]))
            with ops.collective_order():  # every device's results are fetched: a session runs
                first = [algorithm(values, devices) for _ in range(2)]  # only what is needed
            with ops.collective_order():
                second = [algorithm(values, devices) for _ in range(2)]
            with tf.compat.v1.Session(config=towers.session_config()) as sess:
                self.assertAllEqual(sess.run(first), [[[3.0]] * 2] * 2)  # a unit run alone
                self.assertAllEqual(sess.run(second), [[[3.0]] * 2] * 2)
        found = [op for op in graph.get_operations() if op.type == "CollectiveReduceV2"]
        waits = [[c.name for c in op.inputs[0].op.control_inputs] for op in found]
        # Built per call: device 0's, then device 1's; the second of each block waits.
        names = [op.name for op in found]
        self.assertEqual(waits, [[], [], names[0:1], names[1:2], [], [], names[4:5], names[5:6]])

    def test_names_give_new_instances_with_their_own_keys(self):
        first, second = (ops.all_reduce_algorithm("collective") for _ in range(2))
        self.assertIsNot(first, second)
        devices = test_util.devices(2)
        self.assertNotEqual(first.group_key(devices), second.group_key(devices))
        self.assertEqual(first.group_key(devices), first.group_key(devices))
        fixed = ops.CollectiveAllReduce(group_key=2**20 + 5)
        self.assertEqual(fixed.group_key(devices), 2**20 + 5)
        self.assertEqual(fixed.group_key(test_util.devices(3)), 2**20 + 6)
        mine = ops.CollectiveAllReduce(timeout_seconds=5)
        self.assertIs(ops.all_reduce_algorithm(mine), mine)

    def test_timeouts_none_in_functions_a_bound_in_v1_graphs_unless_given(self):
        devices = test_util.devices(2)

        def timeouts(algorithm, v1):
            if v1:
                with tf.Graph().as_default() as graph:
                    placed = []
                    for device in devices:
                        with tf.device(device):
                            placed.append(tf.constant([1.0]))
                    algorithm(placed, devices)
            else:
                graph, _ = _graph(algorithm, devices, tf.TensorSpec([2]))
            return {
                op.get_attr("timeout_seconds")
                for op in graph.get_operations()
                if op.type == "CollectiveReduceV2"
            }

        self.assertEqual(timeouts(ops.CollectiveAllReduce(), v1=False), {0.0})
        self.assertEqual(timeouts(ops.CollectiveAllReduce(), v1=True), {120.0})
        self.assertEqual(timeouts(ops.CollectiveAllReduce(7), v1=False), {7.0})
        self.assertEqual(timeouts(ops.CollectiveAllReduce(7), v1=True), {7.0})
        self.assertEqual(timeouts(ops.CollectiveAllReduce(0), v1=True), {0.0})  # never
        self.assertEqual(timeouts(towers.WorkersAllReduce(), v1=True), {300.0})

    def test_two_instances_on_the_same_devices_do_not_mix(self):
        """Each reduces other shapes; keys shared between them would collide at run time."""
        devices = test_util.devices(4)
        a, b = ops.CollectiveAllReduce(timeout_seconds=30), ops.CollectiveAllReduce(30)
        out_a, _ = _run(a, [np.full([3], i, np.float32) for i in range(4)], devices)
        out_b, _ = _run(b, [np.full([5, 2], i, np.float32) for i in range(4)], devices)
        self.assertAllEqual(out_a[3], [6.0] * 3)
        self.assertAllEqual(out_b[0], np.full([5, 2], 6.0))

    def test_a_name_inside_tf_function(self):
        """Built by name in the step itself (a new instance per trace) works and retraces."""

        @tf.function
        def reduce(x):
            placed = []
            for device in test_util.devices(2):
                with tf.device(device):
                    placed.append(tf.identity(x))
            return ops.all_reduce_algorithm("collective")(placed, test_util.devices(2))

        self.assertAllEqual(reduce(tf.ones([2]))[1], [2.0, 2.0])
        self.assertAllEqual(reduce(tf.ones([3]))[0], [2.0, 2.0, 2.0])

    def test_bad_arguments(self):
        algorithm = ops.RingAllReduce()
        devices = test_util.devices(2)
        with self.assertRaisesRegex(ValueError, "got 2 values and 3 devices"):
            algorithm([tf.ones([2])] * 2, test_util.devices(3))
        with self.assertRaisesRegex(ValueError, r"value 0 is float32\(2,\) and value 1 is "):
            algorithm([tf.ones([2]), tf.ones([3])], devices)
        with self.assertRaisesRegex(ValueError, "`reduction` must be one of"):
            algorithm([tf.ones([2])] * 2, devices, reduction="max")
        with self.assertRaisesRegex(ValueError, "`wire_dtype` must be None, tf.float16"):
            algorithm([tf.ones([2])] * 2, devices, wire_dtype=tf.int8)
        with self.assertRaisesRegex(ValueError, r"one of \('auto'.*got 'tree'"):
            ops.all_reduce_algorithm("tree")
        for size, error in ((0, ValueError), (-1, ValueError), (1.5, TypeError), (True, TypeError)):
            with self.assertRaisesRegex(error, "`devices_per_group` must be an int >= 1 or None"):
                ops.HierarchicalAllReduce(size)
        with self.assertRaisesRegex(ValueError, r"`across` must be one of .*got 'tree'"):
            ops.HierarchicalAllReduce(across="tree")
        with self.assertRaisesRegex(ValueError, r"`across` must be one of .*got 'hierarchical'"):
            ops.HierarchicalAllReduce(across="hierarchical")
        with self.assertRaisesRegex(TypeError, "`across` must be a name from .* got int"):
            ops.HierarchicalAllReduce(across=3)
        with self.assertRaisesRegex(TypeError, "a name from .* or an ops.AllReduce; got int"):
            ops.all_reduce_algorithm(3)
        with self.assertRaisesRegex(
            ValueError, r"`timeout_seconds` must be a finite number >= 0 or None; got -1"
        ):
            ops.CollectiveAllReduce(timeout_seconds=-1)
        message = r"`group_key` must be an int in \[1048576, 2147483647\] or None"  # 2**20..
        for key, error in [(-1, ValueError), (2**19, ValueError), (2**31, ValueError)] + [
            (True, TypeError),
            (1.5, TypeError),
        ]:
            with self.assertRaisesRegex(error, message):
                ops.CollectiveAllReduce(group_key=key)

    def test_the_contract_needs_sum(self):
        class Incomplete(ops.AllReduce):
            pass

        with self.assertRaisesRegex(TypeError, "abstract method.*sum"):
            Incomplete()


class ExactOrRefusedTest(tf.test.TestCase, parameterized.TestCase):
    """What once came back wrong silently: each case exact, or refused when built."""

    @parameterized.parameters(*CPU_ALGORITHMS)
    def test_shapes_that_differ_only_at_run_time_are_an_error(self, algorithm):
        """Before: ring (and auto, hierarchical) returned a wrong sum for lengths 3 and 4."""
        devices = test_util.devices(2)

        @tf.function(input_signature=[tf.TensorSpec([None]), tf.TensorSpec([None])])
        def reduce(a, b):
            placed = []
            for tensor, device in zip((a, b), devices):
                with tf.device(device):
                    placed.append(tf.identity(tensor))
            return _algorithm(algorithm)(placed, devices)

        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "agree in shape"):
            reduce(tf.ones([3]), tf.ones([4]))
        for out in reduce(tf.ones([3]), tf.fill([3], 2.0)):
            self.assertAllEqual(out, [3.0, 3.0, 3.0])

    @parameterized.parameters(*CPU_ALGORITHMS)
    def test_what_cannot_be_added_exactly_is_refused_when_built(self, algorithm):
        devices = test_util.devices(2)
        with self.assertRaisesRegex(TypeError, "adds numbers; got string"):
            _run(_algorithm(algorithm), [np.array([b"a", b"b"])] * 2, devices)
        with self.assertRaisesRegex(TypeError, "mean of int32 values is not an integer"):
            _run(_algorithm(algorithm), [np.array([4, 8], np.int32)] * 2, devices, reduction="mean")
        with self.assertRaisesRegex(ValueError, "int32 values would lose their value"):
            _run(
                _algorithm(algorithm),
                [np.array([12004, 280000], np.int32)] * 2,
                devices,
                wire_dtype=tf.float16,
            )

    @parameterized.parameters(*CPU_ALGORITHMS)
    def test_integer_sums_keep_their_dtype_and_value(self, algorithm):
        on_gpus = test_util.KIND == "GPU"
        for dtype in (np.int8, np.uint8, np.int32, np.int64):
            values = [np.array([1, 2, 3], dtype) * (i + 1) for i in range(3)]
            refused = None
            if on_gpus and dtype in (np.int8, np.uint8):  # no GPU kernel adds them
                refused = "no GPU kernel that adds u?int8"
            elif algorithm == "collective" and dtype in (np.int8, np.uint8):
                refused = "Use 'ring' or 'reduce_broadcast'"
            elif algorithm == "collective" and on_gpus and dtype == np.int32:
                refused = "int32 on GPUs"
            if refused:
                with self.assertRaisesRegex(TypeError, refused):
                    _run(_algorithm(algorithm), values, test_util.devices(3))
                continue
            out, _ = _run(_algorithm(algorithm), values, test_util.devices(3))
            for result in out:
                self.assertEqual(result.dtype, dtype)
                self.assertAllEqual(result, np.array([6, 12, 18], dtype))

    @parameterized.parameters(*CPU_ALGORITHMS)
    def test_what_gpus_cannot_add_is_refused_when_built(self, algorithm):
        """Seen on the H200: int8 has no GPU AddN kernel, and the collective refuses int32
        there at run time, after which every later collective of the process fails. (A v1
        graph names GPUs without needing them: this runs anywhere.)"""
        gpus = ["/device:GPU:0", "/device:GPU:1"]
        with tf.Graph().as_default():
            values = []
            for device in gpus:
                with tf.device(device):
                    values.append(tf.constant([1, 2], tf.int8))
            with self.assertRaisesRegex(TypeError, "no GPU kernel that adds int8"):
                _algorithm(algorithm)(values, gpus)
            if algorithm == "collective":
                values = [tf.cast(v, tf.int32) for v in values]
                with self.assertRaisesRegex(TypeError, "does not add int32 on GPUs"):
                    _algorithm(algorithm)(values, gpus)

    @parameterized.parameters(*CPU_ALGORITHMS)
    def test_gradients_flow_through_every_algorithm(self, algorithm):
        """d/dx_i of sum_j w_j * (sum_k x_k)_j is sum_j w_j: every device's weight.

        Before: the collective algorithm had none (LookupError on CollectiveReduceV2)."""
        devices = test_util.devices(3)
        weights = [1.0, 10.0, 100.0]

        @tf.function
        def grads(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                placed = []
                for i, device in enumerate(devices):
                    with tf.device(device):
                        placed.append(x * float(i + 1))
                out = _algorithm(algorithm)(placed, devices)
                loss = tf.add_n([w * tf.reduce_sum(o) for w, o in zip(weights, out)])
            return tape.gradient(loss, x)

        # x reaches device i times (i + 1); every output is the sum: 111 * (1 + 2 + 3).
        self.assertAllClose(grads(tf.ones([4])), [666.0] * 4)


if __name__ == "__main__":
    tf.test.main()


class OrderingTokenTest(tf.test.TestCase):
    def test_a_token_first_needed_in_a_branch_serves_the_function_after_it(self):
        """Tokens live in the function graph, not in the tf.cond branch that made them."""
        algorithm = ops.CollectiveAllReduce()

        def summed(devices, x):
            return algorithm.sum([x] * len(devices), devices, None)[0]

        @tf.function
        def f(x, flag):
            a = summed(test_util.devices(2), x)
            b = tf.cond(flag, lambda: summed(test_util.devices(4), x), lambda: tf.zeros([2]))
            c = summed(test_util.devices(4), x)
            return a, b, c

        a, b, c = f(tf.ones([2]), tf.constant(True))
        self.assertAllEqual(a, [2.0, 2.0])
        self.assertAllEqual(b, [4.0, 4.0])
        self.assertAllEqual(c, [4.0, 4.0])
