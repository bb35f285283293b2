"""Where the step's verdict and update run: on each device, with nothing between them.

Before: every `Replicated` copy read one verdict made on the first device from every copy's
flags, so each device's update waited for the others' checks (a transfer between devices
each step: 8% of an H200 step at K=2); and on one device the tower and its update were two
XLA programs with the check between them.
"""

import numpy as np
import tensorflow as tf
from absl.testing import parameterized

import towers
from tests import test_util
from tests.towers.optimizers import rules_test
from tests.towers.step import nonfinite_test


def _spec(device):
    spec = tf.DeviceSpec.from_string(device)
    return (spec.device_type or "").upper(), spec.device_index


def _checks(graph):
    """The ops that decide whether gradients are finite: IsFinite, or a compiled check."""
    found = []
    for op in graph.get_operations():
        program = op.node_def.attr["f"].func.name if "f" in op.node_def.attr else ""
        if op.type == "IsFinite" or "__inference_flags_" in program:
            found.append(op)
    return found


def _checks_waited_for(graph):
    """For each op, the devices of the checks it waits for (each op visited once)."""
    checks, found = set(_checks(graph)), {}

    def before(op):
        return [t.op for t in op.inputs] + list(op.control_inputs)

    for start in graph.get_operations():
        todo = [start]
        while todo:  # depth first: an op once all it waits for is known
            op = todo[-1]
            waiting = [b for b in before(op) if b not in found]
            if waiting:
                todo += waiting
                continue
            todo.pop()
            if op not in found:
                devices = {_spec(op.device)} if op in checks else set()
                found[op] = frozenset(devices.union(*(found[b] for b in before(op))))
    return found


def _programs(graph):
    """The step's XLA programs (calls of functions compiled with jit_compile=True)."""
    found = []
    for op in graph.get_operations():
        if "f" in op.node_def.attr:
            function = graph._get_function(op.node_def.attr["f"].func.name)  # noqa: SLF001
            if function is not None and function.definition.attr["_XlaMustCompile"].b:
                found.append(op)
    return found


def _warmed():
    return towers.schedules.LinearWarmup(2, towers.schedules.CosineDecay(0.1, 10))


def _replicated(devices):
    def build():
        model = test_util.Model()
        model(test_util.batch(1)[0])
        return model

    return towers.Replicated(build, devices)


class LocalVerdictTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.product(nonfinite=["skip", "raise"], jit_compile=[False, True])
    def test_each_replica_judges_its_own_gradients(self, nonfinite, jit_compile):
        """Every write of a Replicated step waits only for checks on its own device."""
        devices = test_util.devices(2)
        model = _replicated(devices)
        optimizer = towers.Adam(_warmed())

        @tf.function
        def step(batch):
            return towers.train_step(
                lambda b: test_util.loss_fn(model.local())(b),
                model,
                optimizer,
                batch,
                devices,
                nonfinite=nonfinite,
                jit_compile=jit_compile,
            )

        graph = step.get_concrete_function(test_util.batch(8)).graph
        self.assertLen({_spec(op.device) for op in _checks(graph)}, 2)  # each device checks
        writes = nonfinite_test._writes(graph)
        self.assertNotEmpty(writes)
        waits_for = _checks_waited_for(graph)
        judged = set()  # the devices whose writes (some of them) wait for a check
        for op in writes:
            self.assertLessEqual(waits_for[op], {_spec(op.device)}, op.name)
            judged |= {_spec(op.device)} if waits_for[op] else set()
        self.assertEqual(judged, {_spec(d) for d in devices})

    def test_a_nan_step_changes_no_replica(self):
        """Each replica skips it by its own verdict: weights, slots and counts as before."""
        devices = test_util.devices(2)
        model = _replicated(devices)
        optimizer = towers.Adam(_warmed())
        poison = tf.Variable(1.0)

        @tf.function
        def step(batch):
            return towers.train_step(
                lambda b: test_util.loss_fn(model.local())(b)[0] * poison,
                model,
                optimizer,
                batch,
                devices,
                nonfinite="skip",
                jit_compile=True,
            )

        step(test_util.batch(8))
        state = [v for replica in model.replicas for v in replica.variables]
        state += list(optimizer.variables)
        before = [v.numpy() for v in state]
        poison.assign(np.nan)
        step(test_util.batch(8, seed=1))
        for got, want in zip(state, before):
            self.assertAllEqual(got, want)
        self.assertEqual([int(c) for c in optimizer.iterations.values()], [1, 1])
        poison.assign(1.0)
        step(test_util.batch(8, seed=2))
        towers.check_replicas_identical(model)
        towers.check_replicas_identical(optimizer)

    def test_shares_of_sharded_state_still_meet_in_one_verdict(self):
        """Each copy holds its own variables' gradients only: one verdict, read by all."""
        devices = test_util.devices(2)

        def build():
            model = test_util.Model()
            model(test_util.batch(1)[0])
            return model

        model = towers.Replicated(build, devices, shard_optimizer_state=True)
        optimizer = towers.Adam(0.1)

        @tf.function
        def step(batch):
            return towers.train_step(
                lambda b: test_util.loss_fn(model.local())(b),
                model,
                optimizer,
                batch,
                devices,
                nonfinite="skip",
            )

        graph = step.get_concrete_function(test_util.batch(8)).graph
        waits_for = _checks_waited_for(graph)
        for op in nonfinite_test._writes(graph):  # every write waits for both devices' checks
            if waits_for[op]:
                self.assertLen(waits_for[op], 2, op.name)


class OneProgramTest(tf.test.TestCase, parameterized.TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.references = {case: rules_test._numpy_run(case) for case in ("momentum", "adam")}

    @parameterized.parameters("momentum", "adam")
    def test_one_device_is_one_program_equal_to_the_hand_written_step(self, case):
        """Tower, check and update in one XLA program; the weights as the reference's."""
        devices = test_util.devices(1)
        model = _replicated(devices)
        optimizer = rules_test.CASES[case][0]()

        @tf.function
        def step(batch):
            return towers.train_step(
                lambda b: test_util.loss_fn(model.local())(b),
                model,
                optimizer,
                batch,
                devices,
                jit_compile=True,
            )

        graph = step.get_concrete_function(test_util.batch(11)).graph
        (program,) = _programs(graph)
        self.assertEmpty(nonfinite_test._writes(graph))  # every write inside the program
        self.assertEqual(_spec(program.device), _spec(devices[0]))
        for i in range(rules_test.STEPS):
            step(test_util.batch(11, seed=i))
        for got, want in zip(model.replicas[0].variables, self.references[case].variables):
            test_util.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

    @parameterized.parameters("skip", "raise")
    def test_a_nan_step_in_the_one_program_changes_nothing(self, nonfinite):
        """Weights, Adam's slots and count, BatchNorm's moving averages: all as before."""
        devices = test_util.devices(1)
        model, local, trained = nonfinite_test._normed_model("replicated", devices, sync=False)
        optimizer = towers.Adam(0.1)
        step = nonfinite_test._normed_step(model, devices, nonfinite, local, optimizer, True)
        graph = step.get_concrete_function(tf.zeros([8, 3])).graph
        self.assertLen(_programs(graph), 1)
        good = np.random.default_rng(0).normal(size=(8, 3)).astype(np.float32)
        step(tf.constant(good))
        before = [nonfinite_test._state(m) for m in [*trained, optimizer]]
        bad = good.copy()
        bad[5, 1] = np.nan
        if nonfinite == "raise":
            with self.assertRaisesRegex(
                tf.errors.InvalidArgumentError,
                r"(?s), for\] \[kernel norm/beta norm/gamma\].*changed nothing",
            ):
                step(tf.constant(bad))
        else:
            step(tf.constant(bad))
        for module, state in zip([*trained, optimizer], before):
            for got, want in zip(nonfinite_test._state(module), state):
                self.assertAllEqual(got, want)  # moving mean and variance included
        step(tf.constant(good))
        self.assertEqual(int(optimizer.iterations[0]), 2)

    def test_a_hook_keeps_two_programs(self):
        """A gradient hook runs between the tower's program and the update's."""
        devices = test_util.devices(1)
        model = _replicated(devices)

        @tf.function
        def step(batch):
            return towers.train_step(
                lambda b: test_util.loss_fn(model.local())(b),
                model,
                towers.SGD(0.1),
                batch,
                devices,
                gradient_hook=lambda grads, _: tf.clip_by_global_norm(grads, 1.0)[0],
                jit_compile=True,
            )

        self.assertLen(_programs(step.get_concrete_function(test_util.batch(8)).graph), 3)


if __name__ == "__main__":
    tf.test.main()
