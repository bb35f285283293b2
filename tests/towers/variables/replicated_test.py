import os
import re

import numpy as np
import tensorflow as tf
from absl.testing import parameterized

import towers
from tests import test_util
from towers import ops

STEPS = 8
ALGORITHMS = ("reduce_broadcast", "ring", "collective", "hierarchical", "auto")


def _build(seed=0):
    def build():
        model = test_util.Model(seed)
        model(test_util.batch(1)[0])
        return model

    return build


def _train(variables, local, devices, steps, momentum=0.0, start=0):
    """`steps` train steps; `local()` gives the model a tower reads."""
    optimizer = towers.SGD(0.1, momentum=momentum)

    def loss_fn(batch):
        return test_util.loss_fn(local())(batch)

    step = tf.function(lambda b: towers.train_step(loss_fn, variables, optimizer, b, devices))
    for i in range(start, start + steps):
        step(test_util.batch(11, seed=i))
    return optimizer


def _reference(steps, momentum=0.0, seed=0):
    """The model trained by hand on one device: one tape on the whole batch, a plain update."""
    model = _build(seed)()
    step = test_util.reference_step(model, test_util.loss_fn(model), 0.1, momentum)
    for i in range(steps):
        step(test_util.batch(11, seed=i))
    return model


class _AddEverywhere(ops.AllReduce):
    """A custom algorithm through the public contract: the first device adds every value,
    every device takes a copy of the sum. (Each device adding for itself is not bitwise equal
    everywhere on the H200's machine: its CPUs' and GPUs' `AddN` left copies 1 ulp apart.)"""

    name = "add_everywhere"

    def sum(self, values, devices, wire_dtype):
        with tf.device(devices[0]):
            total = tf.add_n([tf.identity(v) for v in values])
        out = []
        for device in devices:
            with tf.device(device):
                out.append(tf.identity(total))
        return out


class ReplicatedTest(tf.test.TestCase, parameterized.TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.reference = _reference(STEPS)

    # Every algorithm at K=3 (11 examples uneven; hierarchical groups of 2 and 1); the flat
    # built-in ones at 8 too (ring's chunks empty on some devices); hierarchical also at 2
    # (groups of one device) and 4 (groups of 2, as 8's of 4). K=1, the identity, once: an
    # all-reduce of one value is its copy for every algorithm (`ops.AllReduce.__call__`). At 8,
    # "auto" chooses "reduce_broadcast" for this model's sizes, and "custom" adds in a loop
    # over the devices, as at 3.
    @parameterized.parameters(
        ("auto", 1),
        *((algorithm, 3) for algorithm in (*ALGORITHMS, "custom")),
        *((algorithm, 8) for algorithm in ("reduce_broadcast", "ring", "collective")),
        ("hierarchical", 2),
        ("hierarchical", 4),
    )
    def test_steps_equal_a_hand_written_single_device_run(self, algorithm, k):
        devices = test_util.devices(k)
        all_reduce = _AddEverywhere() if algorithm == "custom" else algorithm
        replicas = towers.Replicated(_build(), devices, all_reduce=all_reduce, bucket_bytes=256)
        _train(replicas, replicas.local, devices, STEPS)
        towers.check_replicas_identical(replicas)
        for got, want in zip(replicas.replicas[-1].variables, self.reference.variables):
            test_util.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

    @parameterized.parameters("ring", "collective", "hierarchical")
    def test_a_v1_graph_and_session(self, algorithm):
        """Copies built with other values start as the first (its initial value)."""
        devices = test_util.devices(3)
        seeds = iter(range(3))
        batches = [tf.nest.flatten(test_util.batch(11, seed=i)) for i in range(STEPS)]
        batches = [[t.numpy() for t in batch] for batch in batches]
        with tf.Graph().as_default():
            replicas = towers.Replicated(
                lambda: _build(next(seeds))(), devices, all_reduce=algorithm, bucket_bytes=256
            )
            broadcast = replicas.broadcast()
            feeds = [tf.compat.v1.placeholder(b.dtype, [None, *b.shape[1:]]) for b in batches[0]]
            batch = tf.nest.pack_sequence_as(test_util.batch(1), feeds)
            loss, _ = towers.train_step(
                lambda b: test_util.loss_fn(replicas.local())(b),
                replicas, towers.SGD(0.1), batch, devices,
            )  # fmt: skip
            collectives = [
                op for op in tf.compat.v1.get_default_graph().get_operations()
                if op.type == "CollectiveReduceV2"
            ]  # fmt: skip
            with tf.compat.v1.Session(config=towers.session_config()) as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                towers.check_replicas_identical(replicas, sess)  # built alike, seeds apart
                sess.run(broadcast)
                for flat in batches:
                    sess.run(loss, dict(zip(feeds, flat)))
                got = sess.run(replicas.replicas[-1].variables)
        for value, want in zip(got, self.reference.variables):
            test_util.assert_allclose(value, want, rtol=1e-5, atol=1e-6)
        # Per device, each collective's input waits for the collective before it.
        by_device = {}
        for op in collectives:
            by_device.setdefault(op.device, []).append(op)
        self.assertEqual(len(by_device), 3 if algorithm == "collective" else 0)
        for ops_of_device in by_device.values():
            self.assertGreaterEqual(len(ops_of_device), 2)  # a chain to check
            waits = [op.inputs[0].op.control_inputs for op in ops_of_device]
            self.assertEqual(waits[1:], [[op] for op in ops_of_device[:-1]])

    def test_momentum_per_copy_stays_identical_and_exact(self):
        devices = test_util.devices(3)
        replicas = towers.Replicated(_build(), devices, all_reduce="ring")
        optimizer = _train(replicas, replicas.local, devices, 10, momentum=0.9)
        self.assertLen(optimizer.slot_variables, 3 * 5)  # 5 variables, 3 copies
        copies = optimizer.variable_copies()
        names = ("b1", "embedding", "unused", "w1", "w2")
        self.assertEqual(sorted(copies), [f"slots/{n}/momentum" for n in names])
        self.assertEqual({len(c) for c in copies.values()}, {3})
        towers.check_replicas_identical(replicas)
        towers.check_replicas_identical(optimizer)
        reference = _reference(10, momentum=0.9)
        for got, want in zip(replicas.replicas[2].variables, reference.variables):
            test_util.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

    def test_gradient_hook_runs_on_every_replica(self):
        devices = test_util.devices(3)
        replicas = towers.Replicated(_build(), devices)
        before = replicas.replicas[0].w2.numpy()
        seen = []

        def freeze_w2(grads, variables):
            seen.append([v.name for v in variables])
            return [None if "w2" in v.name else g for g, v in zip(grads, variables)]

        towers.train_step(
            lambda b: test_util.loss_fn(replicas.local())(b),
            replicas,
            towers.SGD(0.1),
            test_util.batch(6),
            devices,
            gradient_hook=freeze_w2,
        )
        self.assertEqual([names[4] for names in seen], ["w2:0", "replica_1/w2:0", "replica_2/w2:0"])
        for replica in replicas.replicas:
            self.assertAllEqual(replica.w2, before)
        self.assertNotAllClose(replicas.replicas[0].w1, _build()().w1)
        towers.check_replicas_identical(replicas)

    def test_placement(self):
        devices = test_util.devices(8)[5:]
        replicas = towers.Replicated(_build(), devices)
        for replica, device in zip(replicas.replicas, devices):
            self.assertEqual(
                {test_util.local_device(v.device) for v in replica.variables}, {device}
            )
        optimizer = towers.SGD(0.1)

        @tf.function
        def step(batch):
            return towers.train_step(
                lambda b: test_util.loss_fn(replicas.local())(b),
                replicas,
                optimizer,
                batch,
                devices,
            )

        graph = step.get_concrete_function(test_util.batch(6)).graph
        # Reads run where their variable lives (checked above): the local replica's device.
        reads = ("Placeholder", "ReadVariableOp")
        for i, device in enumerate(devices):
            pattern = re.compile(rf"(^|/)tower_{i}/")
            placed = {
                test_util.local_device(op.device)
                for op in graph.get_operations()
                if pattern.search(op.name) and op.type not in reads
            }
            self.assertEqual(placed, {device}, f"tower {i}")
        updates = [
            op
            for op in graph.get_operations()
            if op.type in ("ResourceApplyGradientDescent", "ResourceScatterSub")
        ]
        if ops.internal.in_programs(devices[0]):  # (uncompiled on a GPU: a program per copy)
            updates = [
                op
                for op in graph.get_operations()
                if "f" in op.node_def.attr
                and "__inference_update_" in op.node_def.attr["f"].func.name
            ]
        else:
            self.assertLen(updates, 3 * 4)
        self.assertEqual(sorted({test_util.local_device(op.device) for op in updates}), devices)

    def test_weights_see_one_copy_with_tower_free_names(self):
        path = os.path.join(self.get_temp_dir(), "w.npz")
        replicas = towers.Replicated(_build(), test_util.devices(3))
        self.assertEqual(
            list(towers.named_variables(replicas)), ["b1", "embedding", "unused", "w1", "w2"]
        )
        self.assertEqual(replicas.replicas[1].w1.name, "replica_1/w1:0")
        towers.save_weights(replicas, path)
        self.assertEqual(
            sorted(towers.read_weights(path)), ["b1", "embedding", "unused", "w1", "w2"]
        )
        trained = _build(seed=7)()
        towers.save_weights(trained, path)
        towers.restore_weights(replicas, path)
        towers.check_replicas_identical(replicas)
        self.assertAllEqual(replicas.replicas[2].w1, trained.w1)

    def test_resume_with_another_tower_count(self):
        directory = os.path.join(self.get_temp_dir(), "run")
        devices2, devices3 = test_util.devices(2), test_util.devices(3)
        whole = _reference(10, momentum=0.9)

        first = towers.Replicated(_build(), devices2)
        optimizer = _train(first, first.local, devices2, 5, momentum=0.9)
        towers.CheckpointManager(directory, first, optimizer).save(5)

        second = towers.Replicated(_build(seed=3), devices3)
        optimizer = towers.SGD(0.1, momentum=0.9)
        self.assertEqual(towers.CheckpointManager(directory, second, optimizer).restore_latest(), 5)
        towers.check_replicas_identical(optimizer)

        def loss_fn(batch):
            return test_util.loss_fn(second.local())(batch)

        step = tf.function(lambda b: towers.train_step(loss_fn, second, optimizer, b, devices3))
        for i in range(5, 10):
            step(test_util.batch(11, seed=i))
        for got, want in zip(second.replicas[2].variables, whole.variables):
            test_util.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

    def test_copies_with_random_initializers_start_identical_in_a_v1_graph(self):
        """Before: each copy ran its own initializer, and 3 steps trained 3 models."""

        class Random(tf.Module):
            def __init__(self):
                super().__init__(name="random")
                self.w = tf.Variable(tf.random.normal([4, 3]), name="w")
                self.b = tf.Variable(lambda: tf.random.uniform([3]), name="b")

        devices = test_util.devices(3)
        with tf.Graph().as_default(), tf.compat.v1.Session() as session:
            replicas = towers.Replicated(Random, devices)
            x = tf.random.normal([6, 4], seed=1)
            loss, _ = towers.train_step(
                lambda b: tf.reduce_mean(tf.square(b @ replicas.local().w + replicas.local().b)),
                replicas, towers.SGD(0.1), x, devices,
            )  # fmt: skip
            session.run(tf.compat.v1.global_variables_initializer())  # and no broadcast()
            towers.check_replicas_identical(replicas, session)
            first = session.run(replicas.replicas[0].w)
            for _ in range(3):
                session.run(loss)
            towers.check_replicas_identical(replicas, session)
            self.assertNotAllClose(session.run(replicas.replicas[0].w), first)  # it trained
            with self.assertRaisesRegex(ValueError, r"pass the session"):
                towers.check_replicas_identical(replicas)
            session.run(replicas.replicas[1].w.assign_add(tf.ones([4, 3])))
            with self.assertRaisesRegex(ValueError, r"copies differ: w \(replica 1"):
                towers.check_replicas_identical(replicas, session)

    def test_check_names_the_differing_copy(self):
        replicas = towers.Replicated(_build(), test_util.devices(3))
        replicas.replicas[2].w2.assign_add(tf.fill(replicas.replicas[2].w2.shape, 1e-3))
        with self.assertRaisesRegex(
            ValueError,
            r"copies differ: w2 \(replica 2, max difference "
            r"0.001\)",
        ):
            towers.check_replicas_identical(replicas)
        replicas.broadcast()
        towers.check_replicas_identical(replicas)

    def test_arguments_are_checked_where_given(self):
        devices = test_util.devices(2)
        for kwargs, error, message in [
            ({"sparse": "bogus"}, ValueError, r"`sparse` must be one of .* got 'bogus'"),
            ({"bucket_bytes": 0}, ValueError, "`bucket_bytes` must be an int >= 1 or None"),
            ({"wire_dtype": tf.int8}, ValueError, "`wire_dtype` must be None, tf.float16"),
            ({"all_reduce": "fast"}, ValueError, r"`algorithm` must be one of \('auto'"),
        ]:
            with self.assertRaisesRegex(error, message):
                towers.Replicated(_build(), devices, **kwargs)
        with self.assertRaisesRegex(ValueError, r"Device '/device:CPU:9' in `devices` does not"):
            towers.Replicated(_build(), ["/cpu:0", "/cpu:9"])
        with self.assertRaisesRegex(TypeError, "got the single device '/cpu:1'"):
            towers.Replicated(_build(), "/cpu:1")
        with self.assertRaisesRegex(TypeError, "`build` must be a function"):
            towers.Replicated(_build()(), devices)

    def test_bad_inputs(self):
        with self.assertRaisesRegex(ValueError, "distinct and non-empty"):
            towers.Replicated(_build(), ["/cpu:1", "/cpu:1"])
        model = _build()()
        with self.assertRaisesRegex(
            ValueError, "replica 1 that is .* the one of replica 0. `build` must create a new"
        ):
            towers.Replicated(lambda: model, test_util.devices(2))
        with self.assertRaisesRegex(ValueError, "replica 1 that is .*shares variables"):
            towers.Replicated(lambda: _Wrapper(model), test_util.devices(2))
        with self.assertRaisesRegex(ValueError, "model without variables"):
            towers.Replicated(test_util.Model, test_util.devices(2))
        sizes = iter([4, 5])

        def inconsistent():
            return _Sized(next(sizes))

        with self.assertRaisesRegex(
            ValueError,
            r"Replica 1 differs from replica 0 in variables "
            r"\['w'\]",
        ):
            towers.Replicated(inconsistent, test_util.devices(2))
        replicas = towers.Replicated(_build(), test_util.devices(2))
        with self.assertRaisesRegex(
            ValueError, r"must be the devices of the Replicated variables.*got tower 0 of 3"
        ):
            towers.train_step(
                lambda b: test_util.loss_fn(replicas.local())(b),
                replicas,
                towers.SGD(0.1),
                test_util.batch(6),
                test_util.devices(3),
            )

        def creates(batch):
            tf.Variable(1.0, name="late")
            return test_util.loss_fn(replicas.local())(batch)

        with self.assertRaisesRegex(ValueError, "Tower 0 created variable 'late'; with Replicated"):
            towers.train_step(
                creates, replicas, towers.SGD(0.1), test_util.batch(4), test_util.devices(2)
            )


class _Wrapper(tf.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner


class _Sized(tf.Module):
    def __init__(self, n):
        super().__init__()
        self.w = tf.Variable(np.zeros([n], np.float32))


if __name__ == "__main__":
    tf.test.main()
