"""Where the step's verdict is made: on each device, for the copies that hold alike gradients.

Before: every `Replicated` copy read one verdict made on the first device from every copy's
flags, so each device's update waited for the others' checks (a transfer between devices
each step: the guard cost 8% of an H200 GPT step at K=2, 1.9% once each copy judged its own).
"""

from unittest import mock

import numpy as np
import tensorflow as tf
from absl.testing import parameterized

import towers
from tests import test_util
from tests.towers.step import nonfinite_test
from towers.ops import _packed_sum as packed_sum
from towers.ops._finite import BLOCK


def _spec(device):
    spec = tf.DeviceSpec.from_string(device)
    return (spec.device_type or "").upper(), spec.device_index


def _checks(graph):
    """The ops that decide whether gradients are finite: IsFinite, or a compiled check (its
    own program, or a `Replicated` copy's update program, which checks before it writes)."""
    found = []
    for op in graph.get_operations():
        program = op.node_def.attr["f"].func.name if "f" in op.node_def.attr else ""
        if op.type == "IsFinite" or any(
            f"__inference_{name}_" in program for name in ("finite_flags", "update")
        ):
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


def _warmed():
    return towers.schedules.LinearWarmup(2, towers.schedules.CosineDecay(0.1, 10))


def _built():
    model = test_util.Model()
    model(test_util.batch(1)[0])
    return model


def _step(devices, optimizer, poison=None, shard_optimizer_state=False, **options):
    """(model, step): a `Replicated` train_step, its loss times `poison` if given."""
    model = towers.Replicated(_built, devices, shard_optimizer_state=shard_optimizer_state)

    def loss_fn(batch):
        loss = test_util.loss_fn(model.local())(batch)[0]
        return loss if poison is None else loss * poison

    @tf.function
    def step(batch):
        return towers.train_step(loss_fn, model, optimizer, batch, devices, **options)

    return model, step


class _Laid(tf.Module):
    """Three variables that lie in one bucket (a, b, w by name): 37, 5 and 6400 values,
    so that w fills two whole blocks of the bucket and shares its first and last."""

    def __init__(self):
        super().__init__()
        self.a = tf.Variable(tf.ones([37]))
        self.b = tf.Variable(tf.ones([5]))
        self.w = tf.Variable(tf.ones([64, 100]))


class LocalVerdictTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.parameters(packed_sum.LAID_LIMIT, 0)
    def test_a_value_in_a_bucket_names_its_variable_alone(self, limit):
        """Compiled copies check the all-reduced gradients where they lie in their summed
        buckets: a NaN in a block inside one variable, in a block two share, or in the
        bucket's last part block names that variable and no other, and changes nothing.
        The same one by one, where the buckets hold too many small gradients (limit 0)."""
        self.assertGreater(6400, 3 * BLOCK)
        self.enter_context(mock.patch.object(packed_sum, "LAID_LIMIT", limit))
        devices = test_util.devices(2)
        model = towers.Replicated(_Laid, devices)
        masks = {name: tf.Variable(tf.zeros(shape)) for name, shape in (("a", [37]), ("b", [5]))}
        masks["w"] = tf.Variable(tf.zeros([64, 100]))

        def loss_fn(batch):
            local = model.local()
            terms = [tf.reduce_sum(getattr(local, name) * mask) for name, mask in masks.items()]
            return tf.add_n(terms) + tf.reduce_sum(local.w) * tf.reduce_mean(batch)

        optimizer = towers.SGD(0.1)

        @tf.function
        def step(batch):
            return towers.train_step(loss_fn, model, optimizer, batch, devices, jit_compile=True)

        step(tf.ones([4, 2]))
        before = [v.numpy() for replica in model.replicas for v in replica.variables]
        for name, index in (("w", 3000), ("w", 0), ("w", 6399), ("a", 36), ("b", 0), ("b", 4)):
            mask = masks[name]
            spoiled = np.zeros(mask.shape, np.float32).reshape(-1)
            spoiled[index] = np.nan
            mask.assign(spoiled.reshape(mask.shape))
            with self.assertRaisesRegex(tf.errors.InvalidArgumentError, rf", for\] \[{name}\] "):
                step(tf.ones([4, 2]))
            mask.assign(tf.zeros(mask.shape))
            after = [v.numpy() for replica in model.replicas for v in replica.variables]
            for got, want in zip(after, before):
                self.assertAllEqual(got, want)
        step(tf.ones([4, 2]))
        self.assertNotAllClose(model.replicas[0].w, before[2])
        towers.check_replicas_identical(model)

    @parameterized.product(nonfinite=["skip", "raise"], jit_compile=[False, True])
    def test_each_replica_judges_its_own_gradients(self, nonfinite, jit_compile):
        """Every write of a Replicated step waits only for checks on its own device."""
        devices = test_util.devices(2)
        _, step = _step(
            devices, towers.Adam(_warmed()), nonfinite=nonfinite, jit_compile=jit_compile
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
        optimizer, poison = towers.Adam(_warmed()), tf.Variable(1.0)
        model, step = _step(
            test_util.devices(2), optimizer, poison, nonfinite="skip", jit_compile=True
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
        _, step = _step(
            test_util.devices(2), towers.Adam(0.1), shard_optimizer_state=True, nonfinite="skip"
        )
        graph = step.get_concrete_function(test_util.batch(8)).graph
        waits_for = _checks_waited_for(graph)
        for op in nonfinite_test._writes(graph):  # every write waits for both devices' checks
            if waits_for[op]:
                self.assertLen(waits_for[op], 2, op.name)


if __name__ == "__main__":
    tf.test.main()
