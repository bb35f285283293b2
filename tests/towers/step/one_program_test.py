"""One device, compiled: the tower, the guard and the update are one XLA program.

Before (issue #32): two programs, the tower's and the update's, with the verdict's check
between them (1.09x the whole step compiled on one device, on the H200).
"""

import dataclasses

import numpy as np
import tensorflow as tf
from absl.testing import parameterized

import towers
from tests import test_util
from tests.towers.optimizers import rules_test
from tests.towers.step import nonfinite_test
from tests.towers.step.compiled_test import _calls


def _programs(graph: tf.Graph) -> list[str]:
    """The kinds of XLA program a step's graph calls (the function name, its number cut)."""
    return sorted(
        op.node_def.attr["f"].func.name.rsplit("_", 1)[0]
        for op in graph.get_operations()
        if "_XlaMustCompile" in op.node_def.attr
    )


def _replicated(devices):
    def build():
        model = test_util.Model()
        model(test_util.batch(1)[0])
        return model

    model = towers.Replicated(build, devices)
    return model, model.local, model.replicas[0]


def _compiled_step(model, local, optimizer, devices, **options):
    """`train_step(..., jit_compile=True)` on the shared model's loss, in `tf.function`."""

    @tf.function
    def step(batch):
        return towers.train_step(
            lambda b: test_util.loss_fn(local())(b),
            model,
            optimizer,
            batch,
            devices,
            jit_compile=True,
            **options,
        )

    return step


class OneProgramTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.product(case=["momentum", "adam", "lamb"], strategy=["ps", "replicated"])
    def test_equals_the_hand_written_step_as_one_program(self, case, strategy):
        """5 steps on 11 examples (an embedding's sparse rows among the gradients): the
        hand-written step's weights, from one program per step."""
        devices = test_util.devices(1)
        if strategy == "replicated":
            model, local, trained = _replicated(devices)
        else:  # a parameter server on the tower's device
            model = trained = test_util.built_model()
            local = lambda: model  # noqa: E731
        optimizer = rules_test.CASES[case][0]()
        step = _compiled_step(model, local, optimizer, devices)
        graph = step.get_concrete_function(test_util.batch(11)).graph
        self.assertEqual(_programs(graph), ["__inference__body"])
        for i in range(rules_test.STEPS):
            step(test_util.batch(11, seed=i))
        for got, want in zip(trained.variables, rules_test._numpy_run(case).variables):
            test_util.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        for count in optimizer.iterations.values():  # (Adam's and LAMB's; SGD keeps none)
            self.assertEqual(int(count), rules_test.STEPS)

    @parameterized.product(nonfinite=["skip", "raise"], sync=[False, True])
    def test_a_nan_step_changes_nothing_and_nothing_waits_for_the_host(self, nonfinite, sync):
        """Weights, Adam's slots and step count, BatchNorm's moving averages: as before the
        NaN step, chosen inside the program; the program waits for no host check."""
        devices = test_util.devices(1)
        model, local, (trained,) = nonfinite_test._normed_model("replicated", devices, sync)
        optimizer = towers.Adam(0.1)
        optimizer.build(model)  # (one trace, as above)
        step = nonfinite_test._normed_step(model, devices, nonfinite, local, optimizer, True)
        graph = step.get_concrete_function(tf.zeros([8, 3])).graph
        (program,) = _calls(graph)
        self.assertEqual(_programs(graph), ["__inference__body"])
        waits_for = {before.type for before in test_util.ancestors(program)}
        self.assertEmpty(waits_for & set(nonfinite_test._HOST_ROUND_TRIPS))
        good = np.random.default_rng(0).normal(size=(8, 3)).astype(np.float32)
        step(tf.constant(good))
        before = [nonfinite_test._state(m) for m in (trained, optimizer)]
        bad = good.copy()
        bad[5, 1] = np.nan
        if nonfinite == "raise":
            with self.assertRaisesRegex(
                tf.errors.InvalidArgumentError, nonfinite_test.NAMES + ".*changed nothing"
            ) as raised:
                step(tf.constant(bad))
            nonfinite_test._assert_alone(self, raised.exception)
        else:
            step(tf.constant(bad))
        for module, state in zip((trained, optimizer), before):
            for got, want in zip(nonfinite_test._state(module), state):
                self.assertAllEqual(got, want)  # moving mean and variance included
        step(tf.constant(good))
        self.assertEqual(int(optimizer.iterations[0]), 2)
        self.assertFalse(np.array_equal(trained.kernel.numpy(), before[0][0]))

    def test_a_v1_session_runs_the_one_program(self):
        """A v1 graph: the same program, a NaN step raises and changes nothing."""
        devices = test_util.devices(1)
        with tf.Graph().as_default() as graph, tf.compat.v1.Session() as session:
            model, local, (trained,) = nonfinite_test._normed_model("replicated", devices)
            optimizer = towers.Adam(0.1)
            x = tf.compat.v1.placeholder(tf.float32, [8, 3])
            loss, _ = towers.train_step(
                lambda s: tf.reduce_mean(tf.square(local()(s))),
                model,
                optimizer,
                x,
                devices,
                jit_compile=True,
            )
            self.assertEqual(_programs(graph), ["__inference__body"])
            session.run(tf.compat.v1.global_variables_initializer())
            good = np.random.default_rng(0).normal(size=(8, 3)).astype(np.float32)
            session.run(loss, {x: good})
            state = [*trained.variables, *optimizer.variables]
            before = session.run(state)
            bad = good.copy()
            bad[0, 0] = np.inf
            with self.assertRaisesRegex(tf.errors.InvalidArgumentError, nonfinite_test.NAMES):
                session.run(loss, {x: bad})
            for got, want in zip(session.run(state), before):
                self.assertAllEqual(got, want)

    @parameterized.parameters(
        "hook", "loss_scale", "two_towers", "variables_elsewhere", "keras", "own_strategy"
    )
    def test_what_needs_two_programs_keeps_them(self, case):
        """A hook (user code), a loss scale, several towers, variables off the tower's device,
        a user's own optimizer or strategy (whose reduction may change the gradients of one
        tower too): the tower's program, then the update's."""
        devices = test_util.devices(2 if case == "two_towers" else 1)
        if case == "variables_elsewhere":
            model = test_util.built_model()  # a parameter server on the CPU, towers on CPU:1
            devices, local = test_util.devices(2)[1:], lambda: model
        elif case == "own_strategy":
            model = test_util.built_model()
            local = lambda: model  # noqa: E731
        else:
            model, local, _ = _replicated(devices)
        optimizer = tf.keras.optimizers.SGD(0.1) if case == "keras" else towers.SGD(0.1)
        options = {
            "hook": {"gradient_hook": lambda grads, variables: grads},
            "loss_scale": {"loss_scale": 8.0},
            "own_strategy": {"variable_strategy": _Halved()},
        }.get(case, {})
        step = _compiled_step(model, local, optimizer, devices, **options)
        programs = _programs(step.get_concrete_function(test_util.batch(11)).graph)
        self.assertIn("__inference__body", programs)
        self.assertGreater(len(programs), 1)  # (the verdict's check, at least)
        if case != "keras":  # (a user's optimizer runs uncompiled)
            self.assertIn("__inference_update", programs)
        if case == "own_strategy":  # its reduction ran: half the step of SGD on the gradients
            start = [v.numpy() for v in model.trainable_variables]
            step(test_util.batch(11))
            reference = test_util.built_model()
            test_util.reference_step(reference, test_util.loss_fn(reference), 0.05)(
                test_util.batch(11)
            )
            trained = model.trainable_variables
            self.assertTrue(any(not np.array_equal(v.numpy(), w) for v, w in zip(trained, start)))
            for got, want in zip(trained, reference.trainable_variables):
                test_util.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


class _Halved(towers.ParameterServer):
    """A user's strategy: the parameter server's reduction, then the gradients halved."""

    def __init__(self):
        super().__init__(test_util.devices(1))

    def reduce_gradients(self, model, tower_grads, sizes, **options):
        reduced = super().reduce_gradients(model, tower_grads, sizes, **options)
        return [dataclasses.replace(copy, grads=[_half(g) for g in copy.grads]) for copy in reduced]


def _half(grad):
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(grad.values * 0.5, grad.indices, grad.dense_shape)
    return None if grad is None else grad * 0.5


if __name__ == "__main__":
    tf.test.main()
