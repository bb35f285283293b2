"""Float32 gradients that are exactly half-precision ones cross devices narrow, no bit changed.

Under mixed precision a float32 variable's gradient is a bfloat16 gradient cast to float32:
the exchanges send the bfloat16 tensor (half the bytes) and widen it where it is added.
"""

import numpy as np
import tensorflow as tf
from absl.testing import parameterized

from tests import test_util
from towers import ops
from towers.ops import internal

ALGORITHMS = ("reduce_broadcast", "ring", "collective", "hierarchical", "auto", "gather_add")
SHAPES = ([40, 30], [30], [7, 3, 2], [5])  # float32, cast from bfloat16 except [30]


def _grads(devices, seed, hidden=False):
    """Each tower's gradients: bfloat16 values cast to float32 (their narrow form visible, or
    `hidden` behind an identity), and one plain float32 gradient."""
    out = []
    for i, device in enumerate(devices):
        with tf.device(device):
            grads = []
            for j, shape in enumerate(SHAPES):
                value = tf.random.stateless_normal(shape, seed=[seed + i, j])
                if shape != [30]:
                    value = tf.cast(tf.cast(value, tf.bfloat16), tf.float32)
                grads.append(tf.identity(value) if hidden else value)
            out.append(grads)
    return out


def _narrow_crossings(graph, devices):
    """The bfloat16 tensors an op on one device takes from another."""
    crossing = []
    for op in graph.get_operations():
        for tensor in op.inputs:
            if tensor.dtype == tf.bfloat16 and tensor.op.device and op.device:
                if tf.DeviceSpec.from_string(tensor.op.device) != tf.DeviceSpec.from_string(
                    op.device
                ):
                    crossing.append(tensor)
    return crossing


def _both_ways(build):
    """Runs `build(hidden)` (a reduction) with the narrow forms seen and hidden, asserts the
    two give the same bits, and returns (the results, the graph that saw them, the other)."""
    runs = {}
    for hidden in (False, True):
        fn = tf.function(lambda hidden=hidden: build(hidden))
        runs[hidden] = fn(), fn.get_concrete_function().graph
    for got, want in zip(tf.nest.flatten(runs[False][0]), tf.nest.flatten(runs[True][0])):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
    return runs[False][0], runs[False][1], runs[True][1]


class NarrowFormTest(tf.test.TestCase):
    def test_finds_the_half_precision_tensor_behind_a_cast(self):
        """A cast from bfloat16 or float16 to float32 (what a mixed-precision gradient is),
        without control dependencies of its own (its input alone would drop them); nothing
        else."""

        @tf.function
        def build(x):
            half = tf.cast(x, tf.bfloat16)
            f16 = tf.cast(x, tf.float16)
            wide = tf.cast(half, tf.float32)
            self.assertIs(internal.narrow_form(wide), half)
            self.assertIs(internal.narrow_form(tf.cast(f16, tf.float32)), f16)
            with tf.control_dependencies([tf.identity(x)]):
                self.assertIsNone(internal.narrow_form(tf.cast(half, tf.float32)))
            self.assertIsNone(internal.narrow_form(tf.identity(wide)))  # not a cast
            self.assertIsNone(internal.narrow_form(x))  # a float32 from float32
            self.assertIsNone(internal.narrow_form(tf.cast(half, tf.float64)))
            self.assertIsNone(internal.narrow_form(tf.cast(tf.cast(x, tf.int32), tf.float32)))
            self.assertIsNone(internal.narrow_form(half))  # already narrow
            self.assertIsNone(internal.narrow_form(None))
            return wide

        build(tf.ones([3]))
        eager = tf.cast(tf.ones([3], tf.bfloat16), tf.float32)
        self.assertIsNone(internal.narrow_form(eager))

    def test_a_v1_graph_keeps_what_the_cast_waited_for(self):
        """In a v1 graph nothing runs unless something waits for it: a gradient whose cast had
        control dependencies crosses as float32, and they still run."""
        devices = test_util.devices(2)
        with tf.Graph().as_default(), tf.compat.v1.Session() as session:
            with tf.device("/device:CPU:0"):  # (no int32 variable on a GPU; v1: no soft placement)
                counter = tf.Variable(0)
            grads = []
            for i, device in enumerate(devices):
                with tf.device(device):
                    half = tf.cast(tf.fill([40, 30], float(i + 1)), tf.bfloat16)
                    with tf.control_dependencies([counter.assign_add(1)]):
                        grads.append([tf.cast(half, tf.float32)])
            reduced = ops.all_reduce_gradients(grads, devices, algorithm="gather_add")
            session.run(counter.initializer)
            got = session.run(reduced)
            self.assertEqual(session.run(counter), 2)
            np.testing.assert_array_equal(got[1][0], np.full([40, 30], 1.5, np.float32))


class AllReduceTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.parameters(
        *[(algorithm, 2, None) for algorithm in ALGORITHMS],
        ("gather_add", 2, (3, 2)),  # weighed before the sum: float32
        ("gather_add", 3, None),  # sums on the first device: float32
        ("ring", 3, (3, 2, 2)),
    )
    def test_sends_exact_gradients_narrow_and_changes_no_bit(self, algorithm, k, weights):
        """Every tower gets the same bits as when the gradients' narrow forms are hidden. The
        bfloat16 tensors cross devices only where nothing adds them on the way and the weights
        apply after the sum: `gather_add` on two devices (and "auto", which takes it for
        values over 64 KiB on two), with equal weights. (On two devices each element's sum
        is one addition whatever the buckets; on more, the buckets stay as they were.)"""
        devices = test_util.devices(k)
        weights = weights and weights[:k]
        _, graph, hidden_graph = _both_ways(
            lambda hidden: ops.all_reduce_gradients(
                _grads(devices, 7, hidden),
                devices,
                weights=weights,
                algorithm=algorithm,
                bucket_bytes=8 * 1024,
            )  # fmt: skip
        )
        crossing = _narrow_crossings(graph, devices)
        # ("auto" sums these buckets, all under its 64 KiB, with reduce_broadcast: widened.)
        sends = algorithm == "gather_add" and k == 2 and weights is None
        self.assertEqual(bool(crossing), sends, crossing)
        self.assertFalse(_narrow_crossings(hidden_graph, devices))

    def test_auto_sends_large_buckets_narrow_on_two_devices(self):
        """Over its 64 KiB threshold "auto" takes `gather_add` on two devices: the bucket of
        the bfloat16 values crosses narrow, and the sum is the float32 one."""
        devices = test_util.devices(2)

        def reduce(hidden):
            grads = []
            for i, device in enumerate(devices):
                with tf.device(device):
                    value = tf.random.stateless_normal([400, 200], seed=[i, 1])
                    value = tf.cast(tf.cast(value, tf.bfloat16), tf.float32)
                    grads.append([tf.identity(value) if hidden else value])
            return ops.all_reduce_gradients(grads, devices)

        _, graph, _ = _both_ways(reduce)
        self.assertTrue(_narrow_crossings(graph, devices))

    def test_columns_narrow_only_where_every_tower_agrees(self):
        """A column narrow in one tower only, or float16 in one and bfloat16 in the other,
        crosses as float32; a bfloat16 variable's gradient (summed in float32, cast back)
        crosses in bfloat16. Each the same bits as with the narrow forms hidden."""
        devices = test_util.devices(2)

        def column(i, kind, hidden):
            value = tf.random.stateless_normal([40, 30], seed=[i, len(kind)])
            if kind == "bf16 variable":
                return tf.cast(value, tf.bfloat16)
            dtype = tf.float16 if (kind == "mixed" and i == 1) else tf.bfloat16
            value = tf.cast(tf.cast(value, dtype), tf.float32)
            return tf.identity(value) if hidden or (kind == "one tower" and i == 1) else value

        def reduce(hidden):
            grads = []
            for i, device in enumerate(devices):
                with tf.device(device):
                    kinds = ("one tower", "mixed", "bf16 variable")
                    grads.append([column(i, kind, hidden) for kind in kinds])
            return ops.all_reduce_gradients(grads, devices, algorithm="gather_add")

        narrow, graph, _ = _both_ways(reduce)
        self.assertEqual(narrow[0][2].dtype, tf.bfloat16)
        crossing = _narrow_crossings(graph, devices)
        self.assertTrue(crossing)  # the bfloat16 variable's, and nothing else
        self.assertEqual({tuple(t.shape) for t in crossing}, {(1200,)})


class AverageTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.parameters((None, 2), ((3, 2), 2), ((4, 3, 3), 3))
    def test_packed_buckets_cross_narrow_and_change_no_bit(self, weights, k):
        """A parameter server's mean of two towers: each packs the bfloat16 values and the
        variable's device widens them before it weighs and adds them, for any weights. Of
        three, they stay float32: the buckets laid out otherwise, TensorFlow grouped the sum
        of three differently (an ulp apart, in a review's run)."""
        devices = test_util.devices(k)
        with tf.device(devices[0]):
            variables = [tf.Variable(tf.zeros(s), name=f"v{j}") for j, s in enumerate(SHAPES)]
        means, graph, hidden_graph = _both_ways(
            lambda hidden: ops.average_gradients(
                _grads(devices, 3, hidden),
                weights=weights,
                variables=variables,
                bucket_bytes=8 * 1024,
            )  # fmt: skip
        )
        self.assertEqual({m.dtype for m in means}, {tf.float32})
        self.assertEqual(bool(_narrow_crossings(graph, devices)), k == 2)
        self.assertFalse(_narrow_crossings(hidden_graph, devices))


if __name__ == "__main__":
    tf.test.main()
