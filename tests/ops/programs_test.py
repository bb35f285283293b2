"""The update and the guard's pieces as XLA programs in an uncompiled step (`towers.ops._programs`).

On GPUs an uncompiled step's update of a towers rule is one XLA program per device, the
guard's choice inside (and, where a copy's every gradient is in it, its check too); what
stays TensorFlow's kernels (a subclass's rule, varying sparse rows) copies its old values in
one program and chooses in another, and each copy's gradients are checked in a third. These
tests run that path on CPU devices (its device types patched) and hold it to the hand-written
reference, the numpy rules, the kernels' values and the guard's promise.
"""

import re
from unittest import mock

import numpy as np
import tensorflow as tf
from absl.testing import parameterized

import towers
from tests import test_util
from tests.towers.optimizers import rules_test
from tests.towers.step import compiled_test, nonfinite_test
from towers.ops import _exact_widening, _programs, _sparse_mode
from towers.ops.internal import in_programs, selected
from towers.optimizers import _device_updates


def _on_cpus(test):
    test.enter_context(mock.patch.object(_programs, "PROGRAM_DEVICES", frozenset({"CPU", "GPU"})))


def _programs_of(graph, name):
    """The calls of the XLA programs `name` ("old_values", "kept_writes", "finite_flags")."""
    return [
        op
        for op in graph.get_operations()
        if "_XlaMustCompile" in op.node_def.attr
        and f"__inference_{name}_" in op.node_def.attr["f"].func.name
    ]


def _spec(device):
    spec = tf.DeviceSpec.from_string(device)
    return spec.device_type, spec.device_index


class InProgramsTest(tf.test.TestCase):
    def test_gpus_only_by_default(self):
        self.assertTrue(in_programs("/device:GPU:1"))
        self.assertTrue(in_programs("/job:worker/replica:0/task:1/device:GPU:0"))
        self.assertTrue(in_programs("/gpu:0"))
        self.assertFalse(in_programs("/device:CPU:0"))
        self.assertFalse(in_programs(None))
        self.assertFalse(in_programs(""))


class SelectedTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.parameters(True, False)
    def test_writes_kept_or_undone_bit_for_bit(self, keep):
        """Float32 and float64 variables on two devices in two programs each; an int64 one
        the old way. Undone, every value is as it was, -0.0's sign and NaN included."""
        _on_cpus(self)
        devices = test_util.devices(2)
        with tf.device(devices[0]):
            a = tf.Variable([-0.0, np.nan, np.inf, 1.5], name="a")
            n = tf.Variable([1, 2], dtype=tf.int64, name="n")  # (int32: host memory on GPUs)
        with tf.device(devices[1]):
            b = tf.Variable(np.arange(6.0).reshape(2, 3), name="b")  # float64
        olds = [v.numpy() for v in (a, n, b)]

        def build():
            return [
                a.assign_add([1.0, 1.0, 1.0, 1.0]),
                n.assign_add([5, 5]),
                b.scatter_nd_update([[1, 2]], [9.0]),
            ]

        @tf.function
        def step(flag):
            selected(flag, [a, n, b, a], build, programs=True)

        graph = step.get_concrete_function(tf.constant(True)).graph
        for name in ("old_values", "kept_writes"):
            calls = _programs_of(graph, name)
            self.assertEqual(sorted(_spec(c.device) for c in calls), [_spec(d) for d in devices])
        step(tf.constant(keep))
        if keep:
            self.assertAllEqual(a.numpy()[[0, 2, 3]], [1.0, np.inf, 2.5])
            self.assertTrue(np.isnan(a.numpy()[1]))
            self.assertAllEqual(n.numpy(), [6, 7])
            self.assertAllEqual(b.numpy(), [[0, 1, 2], [3, 4, 9]])
        else:
            for var, old in zip((a, n, b), olds):
                self.assertEqual(var.numpy().tobytes(), old.tobytes(), var.name)

    def test_not_without_programs_nor_on_cpus_by_default(self):
        with tf.device(test_util.devices(1)[0]):
            a = tf.Variable([1.0])
        for patched in (True, False):
            with mock.patch.object(
                _programs, "PROGRAM_DEVICES", frozenset({"CPU"}) if patched else frozenset()
            ):

                @tf.function
                def step():
                    selected(tf.constant(True), [a], lambda: a.assign_add([1.0]))

                graph = step.get_concrete_function().graph
                self.assertEmpty(_programs_of(graph, "old_values"))


class UncompiledStepTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.parameters("ps", "replicated", "sharded", "dense", "one_gpu")
    def test_equals_the_reference_and_a_nan_step_changes_nothing(self, strategy):
        """SGD with momentum, uncompiled, on three devices: the steps equal the hand-written
        reference; a NaN step raises (alone, on CPUs) and changes nothing; training goes on
        after it. Every copy's update (its choice inside) and check are programs on its
        devices; no old values are copied apart. With every gradient dense ("dense": the
        embedding's too) each copy's update program decides its verdict: no check apart.
        On one GPU of its own ("one_gpu": `Replicated` on one device, on CPU devices
        `_one_gpu` patched to say so) `sparse="auto"` sends the table dense, and under "raise"
        the one copy's check is a program in front of its update, which the host's check
        reads beside the update; the loss returns from the host after both. Several
        uncompiled copies keep the check after every update."""
        _on_cpus(self)
        devices = test_util.devices(1 if strategy == "one_gpu" else 3)
        if strategy == "one_gpu" and test_util.KIND == "CPU":
            self.enter_context(mock.patch.object(_sparse_mode, "_one_gpu", return_value=True))
        batches = [test_util.batch(12, seed=i) for i in range(3)]
        reference = test_util.built_model()
        ref_step = test_util.reference_step(
            reference, test_util.loss_fn(reference), 0.1, momentum=0.9
        )
        if strategy == "ps":
            model = test_util.built_model()
            local, trained = (lambda: model), [model]
        else:
            model = towers.Replicated(
                test_util.built_model,
                devices,
                shard_optimizer_state=strategy == "sharded",
                sparse="dense" if strategy == "dense" else "auto",
            )
            local, trained = model.local, model.replicas
            if strategy == "one_gpu":
                self.assertEqual(model.sparse, "dense")
        optimizer = towers.SGD(0.1, momentum=0.9)
        poison = tf.Variable(1.0)

        def loss_fn(batch):
            loss, logits = test_util.loss_fn(local())(batch)
            return loss * poison, logits

        @tf.function
        def step(batch):
            return towers.train_step(loss_fn, model, optimizer, batch, devices)

        graph = step.get_concrete_function(batches[0]).graph
        nonfinite_test.assert_no_write_waits_for_the_host(self, graph)
        if strategy == "ps":  # (variables on the first device: its programs alone)
            want = [_spec(devices[0])]
        else:
            want = [_spec(d) for d in devices]
        copied = _programs_of(graph, "old_values")
        if strategy == "replicated" and test_util.KIND == "CPU":  # (the embedding's rows)
            self.assertLen(copied, 3)
        # (Where the exchange leaves no sparse rows, as on GPUs, every copy's update judges.)
        judging = strategy == "dense" or (strategy == "replicated" and not copied)
        if judging:
            self.assertEmpty(_programs_of(graph, "finite_flags"))
        if strategy == "one_gpu":  # (no table copied and chosen beside rows' kernels)
            self.assertEmpty(copied)
            self.assertEmpty(_programs_of(graph, "kept_writes"))
            # One copy under "raise": its flags are made in front of its update, and the
            # host's check reads them beside the update, not after it.
            (check,) = [op for op in graph.get_operations() if op.type == "Assert"]
            (flags,) = _programs_of(graph, "finite_flags")
            self.assertIn(flags, test_util.ancestors(check))
            self.assertEmpty(test_util.ancestors(check) & set(_programs_of(graph, "update")))
            # The loss returns from its host copy once the check and the update have run: no
            # transfer to the GPU after the update and back (wave 5, session 38).
            returned = step.get_concrete_function(batches[0]).structured_outputs[0].op
            while check not in returned.control_inputs:  # (the function's own identities)
                returned = returned.inputs[0].op
            self.assertEqual(_spec(returned.device), ("CPU", 0))
            self.assertLessEqual(set(_programs_of(graph, "update")), test_util.ancestors(returned))
        elif strategy == "dense":  # (several uncompiled copies: the check after every update)
            (check,) = [op for op in graph.get_operations() if op.type == "Assert"]
            updates = set(_programs_of(graph, "update"))
            self.assertLen(updates, 3)
            self.assertEqual(test_util.ancestors(check) & updates, updates)
        for name in ("update", "finite_flags") if not judging else ("update",):
            on = sorted({_spec(c.device) for c in _programs_of(graph, name)})
            if strategy == "sharded":  # (each owner its shares; one owns only the embedding)
                self.assertTrue(on and set(on) <= set(want), on)
            else:
                self.assertEqual(on, want, name)
        # The choice is inside the update's program, but for the embedding's rows where
        # `Replicated`'s exchange leaves each row once (their number changes from step to
        # step): the embedding and its slot, copied and chosen beside their kernels.
        if strategy == "ps":  # (a parameter server's rows: each tower's, in the program)
            self.assertEmpty(copied)
        for call in copied:
            self.assertEqual(
                [t.shape.as_list() for t in call.outputs], [[test_util.VOCAB, test_util.EMBED]] * 2
            )

        for b in batches[:2]:
            step(b)
            ref_step(b)
        before = [nonfinite_test._state(m) for m in [*trained, optimizer]]
        poison.assign(np.nan)
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "changed nothing") as error:
            step(batches[2])
        # (On GPUs TensorFlow reported the error twice here, session 19: nonfinite_test's
        # test_the_error_comes_alone_whatever_the_step_returns says when.)
        if test_util.KIND == "CPU":
            nonfinite_test._assert_alone(self, error.exception)
        else:
            nonfinite_test._assert_ours(self, error.exception)
        for module, state in zip([*trained, optimizer], before):
            for got, want in zip(nonfinite_test._state(module), state):
                self.assertAllEqual(got, want)
        poison.assign(1.0)
        step(batches[2])
        ref_step(batches[2])
        for replica in trained:
            for got, want in zip(replica.trainable_variables, reference.trainable_variables):
                test_util.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

    @parameterized.parameters(False, True)
    def test_one_copy_with_a_variable_off_its_device_checks_after_every_write(self, programs):
        """One copy on a GPU (here a CPU device counted as one), one of its variables placed
        by the user on another device: one without programs (its update stays TensorFlow's
        kernels, which write in place before they choose), or another GPU (`programs`, whose
        transfers a failing check beside the updates could cut). Either way the check waits
        for every write, not for the gradients alone. A NaN step raises and changes
        nothing."""
        _on_cpus(self)
        devices = test_util.devices(2)
        if not programs:
            on = lambda device: bool(device) and _spec(device) == _spec(devices[0])  # noqa: E731
            self.enter_context(mock.patch.object(_device_updates, "in_programs", on))

        class Split(tf.Module):
            def __init__(self):
                super().__init__()
                self.w = tf.Variable(tf.ones([3, 2]), name="w")
                with tf.device(devices[1]):
                    self.b = tf.Variable(tf.zeros([2]), name="b")

        model = towers.Replicated(Split, [devices[0]])
        self.assertEqual(_spec(model.replicas[0].b.device), _spec(devices[1]))
        optimizer = towers.SGD(0.1, momentum=0.9)

        def loss_fn(x):
            local = model.local()
            return tf.reduce_mean(tf.square(x @ local.w + local.b - 1.0))

        @tf.function
        def step(x):
            return towers.train_step(loss_fn, model, optimizer, x, [devices[0]])[0]

        graph = step.get_concrete_function(tf.TensorSpec([8, 3])).graph
        (check,) = [op for op in graph.get_operations() if op.type == "Assert"]
        writes = set(nonfinite_test._writes(graph))
        self.assertNotEmpty(writes)
        self.assertEqual(test_util.ancestors(check) & writes, writes)
        good = np.random.default_rng(0).normal(size=(8, 3)).astype(np.float32)
        step(good)
        before = [nonfinite_test._state(m) for m in [*model.replicas, optimizer]]
        good[5, 1] = np.nan
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "changed nothing"):
            step(good)
        for module, state in zip([*model.replicas, optimizer], before):
            for got, want in zip(nonfinite_test._state(module), state):
                self.assertAllEqual(got, want)

    @parameterized.parameters("raise", None)
    def test_a_keras_optimizer_on_one_copy_trains_as_the_reference(self, nonfinite):
        """A Keras optimizer (no towers rule to make a program of) on one copy, its device
        counted as a GPU: the step builds and equals the hand-written reference. (Session
        35's first early check asked the Keras class for a towers rule's methods.)"""
        import keras

        _on_cpus(self)
        devices = test_util.devices(1)
        model = towers.Replicated(test_util.built_model, devices)
        reference = test_util.built_model()
        ref_step = test_util.reference_step(reference, test_util.loss_fn(reference), 0.1)
        optimizer = keras.optimizers.SGD(0.1)

        @tf.function
        def step(batch):
            return towers.train_step(
                test_util.loss_fn(model.local()), model, optimizer, batch, devices,
                nonfinite=nonfinite,
            )  # fmt: skip

        for i in range(2):
            step(test_util.batch(8, seed=i))
            ref_step(test_util.batch(8, seed=i))
        for got, want in zip(model.replicas[0].trainable_variables, reference.trainable_variables):
            test_util.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

    def test_a_parameter_server_checks_after_every_write(self):
        """A parameter server's one copy (its variables on a device counted as a GPU, its
        towers on two): the check waits for every write, not for the gradients alone (its
        updates' failing check would cut the towers' transfers)."""
        _on_cpus(self)
        devices = test_util.devices(2)
        model = test_util.built_model()

        @tf.function
        def step(batch):
            return towers.train_step(
                test_util.loss_fn(model), model, towers.SGD(0.1), batch, devices
            )

        graph = step.get_concrete_function(test_util.batch(8)).graph
        (check,) = [op for op in graph.get_operations() if op.type == "Assert"]
        writes = set(nonfinite_test._writes(graph))
        self.assertNotEmpty(writes)
        self.assertEqual(test_util.ancestors(check) & writes, writes)

    @parameterized.parameters("replicated", "dense")
    def test_one_nan_gradient_is_named_and_changes_nothing(self, strategy):
        """One variable's gradient NaN, the others finite: the error names that variable
        alone (the flags each copy's update program decides, or its check's) and the step
        changes nothing on any copy."""
        _on_cpus(self)
        devices = test_util.devices(2)
        model = towers.Replicated(
            test_util.built_model, devices, sparse="dense" if strategy == "dense" else "auto"
        )
        optimizer = towers.SGD(0.1, momentum=0.9)
        poison = tf.Variable(0.0)

        def loss_fn(batch):
            local = model.local()
            loss, logits = test_util.loss_fn(local)(batch)
            return loss + tf.reduce_sum(local.b1) * poison, logits  # b1's gradient alone

        @tf.function
        def step(batch):
            return towers.train_step(loss_fn, model, optimizer, batch, devices)

        step(test_util.batch(8))
        before = [nonfinite_test._state(m) for m in [*model.replicas, optimizer]]
        poison.assign(np.nan)
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "changed nothing") as error:
            step(test_util.batch(8, seed=1))
        bad = re.search(r"rate\), for[^\[]*\[([^\]]*)\]", str(error.exception))
        self.assertIsNotNone(bad, str(error.exception))
        self.assertEqual(bad.group(1).split(), ["b1"])
        for module, state in zip([*model.replicas, optimizer], before):
            for got, want in zip(nonfinite_test._state(module), state):
                self.assertAllEqual(got, want)

    @parameterized.parameters("auto", "dense")
    def test_a_v1_session(self, sparse):
        """In a v1 graph the programs run in order too: a NaN step changes nothing (with
        every gradient dense, each copy's update program decides the verdict)."""
        _on_cpus(self)
        devices = test_util.devices(2)
        with tf.Graph().as_default(), tf.compat.v1.Session() as session:
            model = towers.Replicated(test_util.built_model, devices, sparse=sparse)
            optimizer = towers.SGD(0.1, momentum=0.9)
            inputs = test_util.batch(8)
            poison = tf.compat.v1.placeholder(tf.float32, [])

            def loss_fn(batch):
                loss, logits = test_util.loss_fn(model.local())(batch)
                return loss * poison, logits

            loss, _ = towers.train_step(loss_fn, model, optimizer, inputs, devices)
            graph = tf.compat.v1.get_default_graph()
            self.assertLen(_programs_of(graph, "update"), 2)
            if sparse == "dense":
                self.assertEmpty(_programs_of(graph, "finite_flags"))
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(loss, {poison: 1.0})
            state = [v for m in [*model.replicas, optimizer] for v in m.variables]
            before = session.run(state)
            with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "changed nothing"):
                session.run(loss, {poison: np.nan})
            for got, want in zip(session.run(state), before):
                self.assertAllEqual(got, want)
            session.run(loss, {poison: 1.0})
            self.assertFalse(np.array_equal(session.run(state[0]), before[0]))

    @parameterized.parameters("judged", "raise", "hook")
    def test_half_precision_gradients_enter_the_programs_narrow(self, verdict):
        """Under bfloat16 compute a float32 variable's gradient is a bfloat16 one cast to
        float32. On one device the uncompiled update program takes that bfloat16 tensor and
        widens it inside, and so does the check where it is a program apart ("raise", whose
        check is in front of the update, and a hook's, "hook"): no cast runs before them (on
        a GPU, a kernel per gradient and twice the bytes read). Three steps give the weights
        of the same step with the narrow forms hidden (bit for bit on CPUs) and of the
        hand-written whole-batch step (within bfloat16's rounding); a NaN step raises
        ("skip", where the update judges: is skipped) and changes nothing."""
        _on_cpus(self)
        devices = test_util.devices(1)
        hook = (lambda grads, variables: grads) if verdict == "hook" else None
        nonfinite = "skip" if verdict == "judged" else "raise"

        def run(hidden):
            found = compiled_test._hidden_if(hidden)
            with mock.patch.object(_exact_widening, "narrow_form", found):
                model = towers.Replicated(compiled_test._Mixed, devices)
                optimizer = towers.SGD(0.1)

                @tf.function
                def step(batch):
                    return towers.train_step(
                        lambda b: compiled_test._mixed_loss(model.local())(b), model,
                        optimizer, batch, devices, gradient_hook=hook, nonfinite=nonfinite,
                    )  # fmt: skip

                for i in range(3):
                    step(compiled_test._mixed_batch(i))
                weights = [v.numpy() for v in model.replicas[0].variables]
                inputs, labels = compiled_test._mixed_batch(3)
                inputs[5, 7] = np.nan
                if nonfinite == "skip":
                    step((inputs, labels))
                else:
                    with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "NaN or Inf"):
                        step((inputs, labels))
                for got, want in zip(model.replicas[0].variables, weights):
                    np.testing.assert_array_equal(got.numpy(), want)
                graph = step.get_concrete_function(compiled_test._mixed_batch(0)).graph
            return weights, graph

        (narrow, graph), (wide, hidden_graph) = run(False), run(True)
        reference = compiled_test._Mixed()
        by_hand = test_util.reference_step(reference, compiled_test._mixed_loss(reference), 0.1)
        for i in range(3):
            by_hand(compiled_test._mixed_batch(i))
        for got, want, hand in zip(narrow, wide, reference.variables):
            if test_util.KIND == "CPU":
                np.testing.assert_array_equal(got, want)
            else:  # (the two programs may fuse the rule differently: float32 round-off)
                test_util.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
            test_util.assert_allclose(got, hand, rtol=2e-2, atol=2e-3)
        names = ("update",) if verdict == "judged" else ("update", "finite_flags")
        for name in names:
            (call,) = _programs_of(graph, name)
            dtypes = [t.dtype for t in call.inputs]
            self.assertEqual(dtypes.count(tf.bfloat16), 2, name)  # (kernel and out)
            self.assertNotIn("Cast", [t.op.type for t in call.inputs], name)
            (hidden,) = _programs_of(hidden_graph, name)
            self.assertNotIn(tf.bfloat16, [t.dtype for t in hidden.inputs], name)
        if verdict == "judged":
            self.assertEmpty(_programs_of(graph, "finite_flags"))


class UncompiledUpdateTest(tf.test.TestCase, parameterized.TestCase):
    """On a GPU an uncompiled step's update of a towers rule is one XLA program per device."""

    @parameterized.parameters(
        ("momentum", True), ("adam", True), ("lamb", True), ("momentum", False), ("adam", False)
    )
    def test_a_rule_in_one_program_equals_the_numpy_rule(self, case, finite):
        """Twenty steps: the numpy rule's weights (or, with the verdict False, the state as
        built), one update program and nothing else."""
        _on_cpus(self)
        rules_test.twenty_steps(self, case, finite, jit_compile=False)

    @parameterized.parameters(True, False)
    def test_a_rule_of_ones_own_and_varying_rows_stay_kernels(self, keep):
        """A subclass's rule may hold ops XLA cannot compile, and rows whose number changes
        would be made dense: both keep TensorFlow's kernels and the choice beside them (the
        old values copied in one program, chosen in another), beside a towers rule's dense
        update in its program. The values are the plain path's (to float32 round-off: XLA
        fuses the rule's arithmetic); an undone step's, bit for bit."""

        class Halving(towers.Optimizer):  # a subclass's rule (XLA may not compile it)
            uses_step = False

            def update(self, grad, var, slots, lr, step):
                return var.assign_sub(grad * lr / 2)

        def run(patched):
            self.enter_context(
                mock.patch.object(
                    _programs, "PROGRAM_DEVICES", frozenset({"CPU", "GPU"} if patched else ())
                )
            )
            with tf.device(test_util.devices(1)[0]):
                dense = tf.Variable(np.arange(6.0, dtype=np.float32).reshape(3, 2))
                rows = tf.Variable(np.ones([5, 2], np.float32))
                own = tf.Variable(np.full([2], 3.0, np.float32))
            sgd, halving = towers.SGD(0.1, momentum=0.9), Halving(0.5, name="halving")

            @tf.function(
                input_signature=[tf.TensorSpec([None], tf.int32), tf.TensorSpec([], tf.bool)]
            )
            def step(ids, flag):
                values = tf.ones([tf.size(ids), 2])
                sparse = tf.IndexedSlices(values, ids, tf.constant([5, 2]))
                sgd.apply_gradients([(tf.ones([3, 2]), dense), (sparse, rows)], finite=flag)
                halving.apply_gradients([(tf.ones([2]), own)], finite=flag)

            for ids in ([1, 3], [0, 2, 4], [4]):
                step(tf.constant(ids), tf.constant(True))
            before = [v.numpy() for v in (dense, rows, own, *sgd.variables)]
            step(tf.constant([2, 2, 0]), tf.constant(keep))
            if not keep:
                for var, old in zip((dense, rows, own, *sgd.variables), before):
                    self.assertEqual(var.numpy().tobytes(), old.tobytes())
            graph = step.get_concrete_function().graph
            return [v.numpy() for v in (dense, rows, own)], graph

        (programmed, graph), (plain, plain_graph) = run(True), run(False)
        for got, want in zip(programmed, plain):
            test_util.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
        self.assertLen(_programs_of(graph, "update"), 1)  # the dense variable's (and slot's)
        self.assertLen(_programs_of(graph, "old_values"), 2)  # the rows', then the own rule's
        self.assertLen(_programs_of(graph, "kept_writes"), 2)
        for name in ("update", "old_values", "kept_writes"):
            self.assertEmpty(_programs_of(plain_graph, name))

    def test_any_rule_of_ones_own_keeps_the_kernels(self):
        """A subclass that writes any of the rule's methods (`update`, `update_sparse`,
        `_update_one`), or an instance given its own, keeps TensorFlow's kernels; a subclass
        that changes only its construction keeps towers' rule, and its program."""

        class Sparse(towers.SGD):
            def update_sparse(self, grad, var, slots, lr, step):
                return super().update_sparse(grad, var, slots, lr, step)

        class One(towers.SGD):
            def _update_one(self, *args, **kwargs):
                return super()._update_one(*args, **kwargs)

        class Named(towers.SGD):
            def __init__(self, rate):
                super().__init__(rate, momentum=0.9, name="named")

        patched = towers.SGD(0.1)
        patched.update = patched.update  # an instance's own (bound here: the same rule)
        with tf.Graph().as_default(), tf.device("/device:GPU:0"):
            var = tf.Variable(tf.ones([3]))
            pairs = [(tf.ones([3]), var)]
            for optimizer, programmed in [
                (towers.SGD(0.1), True),
                (towers.Adam(0.1), True),
                (Named(0.1), True),
                (Sparse(0.1), False),
                (One(0.1), False),
                (patched, False),
            ]:
                got = _device_updates.one_program(optimizer, pairs, "/device:GPU:0")
                self.assertEqual(got, programmed, type(optimizer).__name__)

    def test_eager_calls_and_unguarded_rows_keep_the_kernels(self):
        """An eager call would trace and compile the program anew each time; rows without a
        verdict would be made dense (a pass over the whole table): both keep the kernels."""
        _on_cpus(self)
        with tf.device(test_util.devices(1)[0]):
            var = tf.Variable(np.ones([5, 2], np.float32))
        optimizer = towers.SGD(0.1, momentum=0.9)
        rows = tf.IndexedSlices(tf.ones([2, 2]), tf.constant([1, 3]), tf.constant([5, 2]))
        with mock.patch.object(_device_updates, "compiled_update", side_effect=AssertionError):
            optimizer.apply_gradients([(tf.ones([5, 2]), var)], finite=tf.constant(True))

            @tf.function
            def unguarded():
                optimizer.apply_gradients([(rows, var)])

            unguarded()
        self.assertAllClose(var.numpy()[[1, 3]], np.full([2, 2], 0.71, np.float32))


if __name__ == "__main__":
    tf.test.main()
