"""The guard of a compiled `Replicated` step on two devices: each checks the buckets it sends.

With `gather_add` each device's update adds both towers' buckets as it reads them; the check
reads only the device's own bucket, in a program of its own, and the flags cross with the
buckets (`towers.ops._crossed_flags`). A term passes when twice it is finite.
"""

from unittest import mock

import numpy as np
import tensorflow as tf
from absl.testing import parameterized

import towers
import towers.step._nonfinite
from tests import test_util
from tests.towers.step import nonfinite_test
from towers import ops

SIZE = 3000  # one and a half blocks of `towers.ops._finite.BLOCK`: a shared block too
HUGE = 2e38  # above half of float32's largest (3.4e38): two of them overflow


class _Linear(tf.Module):
    def __init__(self):
        super().__init__(name="linear")
        self.w = tf.Variable(tf.zeros([SIZE]), name="w")
        self.b = tf.Variable(tf.zeros([5]), name="b")

    def __call__(self, x):
        return tf.reduce_sum(x * self.w, 1) + tf.reduce_sum(x[:, :5] * self.b, 1)


def _loss(model):
    return lambda x: tf.reduce_mean(tf.square(model(x) - 1.0))


def _batch(seed):
    return np.random.default_rng(seed).normal(size=(4, SIZE)).astype(np.float32) * 0.01


def _data_ancestors(op: tf.Operation) -> set[tf.Operation]:
    """Every op whose value `op` reads, through its inputs (not its control inputs)."""
    seen, todo = set(), [op]
    while todo:
        for before in [t.op for t in todo.pop().inputs]:
            if before not in seen:
                seen.add(before)
                todo.append(before)
    return seen


def _calls(graph: tf.Graph, program: str) -> list[tf.Operation]:
    """The call ops of compiled programs named `program` in a step's graph."""
    return [
        op
        for op in graph.get_operations()
        if op.type in ("StatefulPartitionedCall", "PartitionedCall")
        and "_XlaMustCompile" in op.node_def.attr
        and f"__inference_{program}_" in op.node_def.attr["f"].func.name
    ]


class CrossedFlagsTest(tf.test.TestCase, parameterized.TestCase):
    def _step(self, nonfinite="skip", all_reduce="gather_add"):
        devices = test_util.devices(2)
        model = towers.Replicated(_Linear, devices, all_reduce=all_reduce)
        optimizer = towers.SGD(0.1)

        @tf.function
        def step(x):
            return towers.train_step(
                lambda b: _loss(model.local())(b), model, optimizer, x, devices,
                jit_compile=True, nonfinite=nonfinite,
            )  # fmt: skip

        return model, step

    def _weights(self, model):
        return [[v.numpy() for v in replica.variables] for replica in model.replicas]

    def _assert_unchanged_then_like_by_hand(self, model, before, step, by_hand, reference, seed):
        """Every copy's weights are `before`; after one more step (and the hand-written
        one on `reference`, from batch `seed`) they equal the reference's."""
        for copy_before, copy_after in zip(before, self._weights(model)):
            for want, got in zip(copy_before, copy_after):
                np.testing.assert_array_equal(got, want)
        step(_batch(seed))
        by_hand(_batch(seed))
        for replica in model.replicas:
            for got, want in zip(replica.variables, reference.variables):
                test_util.assert_allclose(got, want, rtol=1e-5, atol=1e-7)

    def test_each_device_checks_the_buckets_it_made(self):
        """One check program on each tower's device, whose flags both updates take (two
        flag vectors each); none without a guard, and none where the sum is made before it
        reaches the update (a ring)."""
        devices = test_util.devices(2)
        _, step = self._step()
        graph = step.get_concrete_function(_batch(0)).graph
        checks = _calls(graph, "crossed_flags")
        self.assertEqual(sorted(test_util.local_device(c.device) for c in checks), devices)
        updates = _calls(graph, "update")
        self.assertLen(updates, 2)
        for call in updates:
            flags = [t for t in call.inputs if t.dtype == tf.bool]
            self.assertEqual([t.shape.as_list() for t in flags], [[2], [2]], call.name)
        self.assertEmpty(_calls(graph, "finite_flags"))  # no check of the sum on its own
        for nonfinite, all_reduce in ((None, "gather_add"), ("skip", "ring")):
            _, other = self._step(nonfinite, all_reduce)
            graph = other.get_concrete_function(_batch(0)).graph
            self.assertEmpty(_calls(graph, "crossed_flags"), (nonfinite, all_reduce))

    @parameterized.parameters("skip", "raise")
    def test_the_flags_cross_between_the_devices_not_through_the_host(self, nonfinite):
        """Each copy's update waits for both devices' check programs (the flags that
        crossed), and no write of the step waits for an Assert, an If or a Switch (a host
        round trip), "raise" included."""
        _, step = self._step(nonfinite)
        graph = step.get_concrete_function(_batch(0)).graph
        checks = set(_calls(graph, "crossed_flags"))
        self.assertLen(checks, 2)
        updates = _calls(graph, "update")
        self.assertLen(updates, 2)
        for call in updates:
            self.assertEqual(test_util.ancestors(call) & checks, checks, call.name)
        nonfinite_test.assert_no_write_waits_for_the_host(self, graph)

    def test_raise_reads_the_flags_made_before_the_exchange_not_the_updates_results(self):
        """ "raise"'s check on the host reads only values made before the exchange: both
        devices' flags of their buckets, none of an update program's results. Every write
        of the step is a compiled program that makes its own choice, so the check waits
        for the exchange, not for the updates (on a GPU, it runs beside them). Without
        crossed flags (a ring) it reads what the update programs decided."""
        _, step = self._step("raise")
        graph = step.get_concrete_function(_batch(0)).graph
        (check,) = [op for op in graph.get_operations() if op.type == "Assert"]
        self.assertEqual(tf.DeviceSpec.from_string(check.device).device_type, "CPU")
        updates, checks = set(_calls(graph, "update")), set(_calls(graph, "crossed_flags"))
        self.assertLen(updates, 2)
        self.assertEqual(_data_ancestors(check) & (updates | checks), checks)
        self.assertEmpty(test_util.ancestors(check) & updates)  # beside them
        _, ring = self._step("raise", "ring")
        graph = ring.get_concrete_function(_batch(0)).graph
        (check,) = [op for op in graph.get_operations() if op.type == "Assert"]
        self.assertNotEmpty(_data_ancestors(check) & set(_calls(graph, "update")))

    @parameterized.parameters("gather_add", "ring")
    def test_no_op_of_the_check_waits_for_more_than_it_reads(self, all_reduce):
        """What "raise"'s check reports (the flags' conjunction, the bad gradients' names)
        waits for no update it does not read. On a GPU a wait for an update ends when the
        update has run, so each op of the check left behind it was time at the step's end
        (wave 5, sessions 28 and 29). With a ring the flags are the update programs'
        results, which the check reads, but no op of it waits for more."""
        _, step = self._step("raise", all_reduce)
        graph = step.get_concrete_function(_batch(0)).graph
        (check,) = [op for op in graph.get_operations() if op.type == "Assert"]
        updates = set(_calls(graph, "update"))
        self.assertLen(updates, 2)
        for op in [check, *_data_ancestors(check)]:
            waits = {before for before in test_util.ancestors(op) if before in updates}
            self.assertEqual(waits, waits & _data_ancestors(op), op.name)

    def test_the_hosts_flags_are_those_each_update_program_decides_from(self):
        """What "raise"'s host check reads (`Judged.before`) equals, flag for flag, what the
        first copy's update program decides from: gradients given in another order than
        packed, from two all-reduces (two packed sums), in many buckets, one crossing
        narrow (a bfloat16 one widened), and the rate. Finite; a NaN or Inf in one tower;
        2e38 in both (the sum overflows); the rate gone NaN. With the second all-reduce a
        ring (its sums made before the update, so checked in the program): no flags from
        the host's side, and nothing built for them."""
        self._compare_host_and_program_flags("gather_add")
        self._compare_host_and_program_flags("ring")

    def _compare_host_and_program_flags(self, second):
        devices = test_util.devices(2)
        shapes = [[3000], [5], [700], [2, 600], [1]]
        copies = []
        for device in devices:
            with tf.device(device):
                copies.append(
                    [tf.Variable(tf.zeros(s), name=f"v{j}") for j, s in enumerate(shapes)]
                )
        rate = tf.Variable(0.1)  # (a variable: checked with the gradients)
        optimizer = towers.SGD(rate)
        order = [4, 2, 0, 3, 1]
        seen = []

        def recorded(judged_copies, *args, **kwargs):
            first, graph = judged_copies[0], tf.compat.v1.get_default_graph()
            built = len(graph.get_operations())
            with ops.internal.host_scope():
                host = first.before()
            seen.append((first.flags, host, len(graph.get_operations()) - built))
            return judged(judged_copies, *args, **kwargs)

        judged = towers.step._nonfinite.judged

        @tf.function
        def step(grads):
            towers_grads = []
            for i, device in enumerate(devices):
                with tf.device(device):
                    mine = [tf.identity(g[i]) for g in grads]
                    mine[2] = tf.cast(tf.cast(mine[2], tf.bfloat16), tf.float32)  # narrow
                    towers_grads.append(mine)
            reduced = [[None] * len(shapes) for _ in devices]
            for group, algorithm in (([0, 1, 2], "gather_add"), ([3, 4], second)):
                out = ops.all_reduce_gradients(
                    [[g[j] for j in group] for g in towers_grads], devices,
                    algorithm=algorithm, bucket_bytes=4096,
                )  # fmt: skip
                for i in range(len(devices)):
                    for j, grad in zip(group, out[i]):
                        reduced[i][j] = grad
            copies_reduced = [
                towers.ReducedGradients([r[j] for j in order], [c[j] for j in order], d)
                for r, c, d in zip(reduced, copies, devices)
            ]
            with mock.patch.object(towers.step._nonfinite, "judged", recorded):
                updates = towers.apply_reduced(
                    copies_reduced, optimizer, nonfinite="skip", jit_compile=True
                )
            program, host, built = seen[-1]
            if second != "gather_add":
                self.assertIsNone(host)
                self.assertEqual(built, 0)
                host = program
            with tf.control_dependencies(updates):
                return tf.identity(program), tf.identity(host)

        rng = np.random.default_rng(0)
        for tower, j, value in [(0, 0, 0.0), (0, 0, np.nan), (1, 2, np.inf), (0, 3, 2e38)]:
            grads = [(rng.normal(size=[2, *s]) * 0.01).astype(np.float32) for s in shapes]
            grads[j][(tower,) + (1,) * len(shapes[j])] = value
            if value == 2e38:
                grads[j][(1,) + (1,) * len(shapes[j])] = value  # both towers: the sum overflows
            for bad_rate in (False, True):
                rate.assign(np.nan if bad_rate else 0.1)
                program, host = step(grads)
                self.assertAllEqual(host, program, (tower, j, value, bad_rate))
                finite = value == 0.0 and not bad_rate
                self.assertEqual(bool(np.all(program)), finite, (tower, j, value, bad_rate))

    @parameterized.parameters("first", "second")
    def test_a_nan_step_raises_naming_its_weight_and_changes_nothing(self, tower):
        """A NaN in either tower's examples under "raise": the error names both weights
        (the NaN reaches the loss's derivative, so every gradient of that tower), in the
        variables' order, and neither copy changed; the next finite step equals the
        hand-written whole-batch step's."""
        reference = _Linear()
        by_hand = test_util.reference_step(reference, _loss(reference), 0.1)
        model, step = self._step("raise")
        step(_batch(0))
        by_hand(_batch(0))
        before = self._weights(model)
        poisoned = _batch(9)
        poisoned[0 if tower == "first" else 3, 7] = np.nan
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, r", for\] \[b w\] ") as raised:
            step(poisoned)
        # The check runs beside the updates: where it fails first, TensorFlow may report its
        # error once more for each device whose part of the step it cut (the result's copy).
        nonfinite_test._assert_ours(self, raised.exception, most=3)
        self._assert_unchanged_then_like_by_hand(model, before, step, by_hand, reference, 1)

    def test_a_v1_session_that_runs_the_loss_fails_and_changes_nothing(self):
        """A v1 graph has no function to wait for its stateful ops: running the loss runs
        the updates and the check beside them (it waits for the exchange only), fails, and
        leaves both copies and the step counts as they were."""
        devices = test_util.devices(2)
        with tf.Graph().as_default(), tf.compat.v1.Session() as session:
            model = towers.Replicated(_Linear, devices, all_reduce="gather_add")
            optimizer = towers.Adam(0.1)
            x = tf.compat.v1.placeholder(tf.float32, [4, SIZE])
            loss, _ = towers.train_step(
                lambda b: _loss(model.local())(b), model, optimizer, x, devices, jit_compile=True
            )
            (check,) = [op for op in x.graph.get_operations() if op.type == "Assert"]
            updates = set(_calls(x.graph, "update"))
            self.assertLen(updates, 2)
            self.assertEmpty(test_util.ancestors(check) & updates)
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(loss, {x: _batch(0)})
            state = [v for m in [*model.replicas, optimizer] for v in m.variables]
            before = session.run(state)
            poisoned = _batch(1)
            poisoned[2, 9] = np.inf
            with self.assertRaisesRegex(tf.errors.InvalidArgumentError, r", for\] \[b w\] ") as e:
                session.run(loss, {x: poisoned})
            nonfinite_test._assert_ours(self, e.exception, most=3)
            for got, want in zip(session.run(state), before):
                self.assertAllEqual(got, want)
            session.run(loss, {x: _batch(2)})
            self.assertFalse(np.array_equal(session.run(state[0]), before[0]))

    def test_a_nan_in_the_other_towers_bucket_skips_both_copies(self):
        """A NaN in the second tower's examples: both copies skip the step (the first copy
        learns it from the flags that crossed), and the finite steps around it equal the
        hand-written whole-batch step's."""
        reference = _Linear()
        by_hand = test_util.reference_step(reference, _loss(reference), 0.1)
        model, step = self._step()
        for seed in range(2):
            step(_batch(seed))
            by_hand(_batch(seed))
        before = self._weights(model)
        poisoned = _batch(9)
        poisoned[3, 7] = np.nan  # the second tower's shard
        step(poisoned)
        self._assert_unchanged_then_like_by_hand(model, before, step, by_hand, reference, 2)
        towers.check_replicas_identical(model)

    @parameterized.parameters(
        ("each tower's gradient finite, their sum not", HUGE, HUGE),
        ("a term above half the largest, the sum in range (the documented corner)", HUGE, -HUGE),
    )
    def test_a_term_counts_as_finite_when_twice_it_is(self, _, first, second):
        """Gradients of 2e38 in each tower: finite, but their sum overflows. The step is
        skipped (with "raise": fails, naming the weight), as a check of the sum would; and,
        since each device checks only its own term, so is a step whose terms cancel."""
        x = np.zeros([4, SIZE], np.float32)
        x[0, 100], x[2, 100] = first, second  # d loss / d w[100] in each tower: -x
        model, step = self._step()
        before = self._weights(model)
        step(x)
        for copy_before, copy_after in zip(before, self._weights(model)):
            for want, got in zip(copy_before, copy_after):
                np.testing.assert_array_equal(got, want)
        model, step = self._step("raise")
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, r"NaN or Inf.*\n?.*\bw\b"):
            step(x)
        self.assertAllEqual(model.replicas[1].variables[1], np.zeros([SIZE]))
