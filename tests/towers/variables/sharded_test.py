"""Sharded optimizer state: each copy keeps its own variables' state; the same step as unsharded."""

import os

import numpy as np
import tensorflow as tf
from absl.testing import parameterized

import towers
from tests import test_util

RULES = {
    "adam": lambda: towers.Adam(0.01),
    "lamb": lambda: towers.LAMB(0.01, weight_decay=0.01),
    "momentum": lambda: towers.SGD(0.1, momentum=0.9),
}
STEPS = 2


def _train(k, shard, rule="adam", steps=STEPS, start=0, replicas=None, optimizer=None, **step):
    """`steps` steps of 11 examples (uneven over k towers) from `start`; (replicas, optimizer)."""
    devices = test_util.devices(k)
    replicas = replicas or towers.Replicated(
        test_util.built_model, devices, shard_optimizer_state=shard
    )
    optimizer = optimizer or RULES[rule]()

    @tf.function
    def train(batch):
        return towers.train_step(
            lambda b: test_util.loss_fn(replicas.local())(b), replicas, optimizer, batch, devices,
            **step,
        )  # fmt: skip

    for i in range(start, start + steps):
        train(test_util.batch(11, seed=i))
    return replicas, optimizer


def _state_bytes(optimizer) -> dict[str, int]:
    """Bytes of optimizer slots per device."""
    found = {}
    for var in optimizer.slot_variables:
        device = test_util.local_device(var.device)
        found[device] = found.get(device, 0) + var.shape.num_elements() * var.dtype.size
    return found


class ShardedStateTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.parameters(("adam", 3), ("lamb", 4), ("momentum", 4))
    def test_equals_unsharded_with_a_share_of_the_state_per_device(self, rule, k):
        """3 steps of 11 examples (uneven over 3 and 4 towers); each rule once (its slots, the
        norms LAMB takes per variable), each tower count once."""
        plain, plain_state = _train(k, False, rule, steps=3)
        sharded, state = _train(k, True, rule, steps=3)
        for got, want in zip(sharded.replicas[-1].variables, plain.replicas[0].variables):
            test_util.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
        towers.check_replicas_identical(sharded)
        per_device = _state_bytes(state)
        whole = sum(_state_bytes(plain_state).values()) // k  # one copy's state
        largest = max(
            v.shape.num_elements() * v.dtype.size * len(state.slot_names)
            for v in sharded.variables_of(0)
        )
        self.assertEqual(sum(per_device.values()), whole)
        self.assertLessEqual(max(per_device.values()), whole / k + largest)
        self.assertEqual(len(set(sharded.owners)), k)  # every device holds a share

    def test_resumes_across_tower_counts_and_sharding(self):
        directory = os.path.join(self.get_temp_dir(), "run")
        whole, _ = _train(2, False, steps=4)
        first, optimizer = _train(3, True, steps=2)
        with towers.CheckpointManager(directory, first, optimizer) as manager:
            manager.save(2)
        for k, shard in ((4, True), (2, False)):
            devices = test_util.devices(k)
            replicas = towers.Replicated(
                test_util.built_model, devices, shard_optimizer_state=shard
            )
            optimizer = towers.Adam(0.01)
            with towers.CheckpointManager(directory, replicas, optimizer) as manager:
                self.assertEqual(manager.restore_latest(), 2)
            resumed, _ = _train(k, shard, steps=2, start=2, replicas=replicas, optimizer=optimizer)
            for got, want in zip(resumed.replicas[-1].variables, whole.replicas[0].variables):
                test_util.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
        model, optimizer = test_util.built_model(), towers.Adam(0.01)  # a parameter server
        with towers.CheckpointManager(directory, model, optimizer) as manager:
            self.assertEqual(manager.restore_latest(), 2)
        devices, server = test_util.devices(3), towers.ParameterServer(test_util.devices(1)[0])

        @tf.function
        def train(batch):
            return towers.train_step(
                test_util.loss_fn(model), model, optimizer, batch, devices,
                variable_strategy=server,
            )  # fmt: skip

        for i in (2, 3):
            train(test_util.batch(11, seed=i))
        for got, want in zip(model.variables, whole.replicas[0].variables):
            test_util.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
        model = test_util.built_model()  # and a single-device program loads the weights
        towers.restore_weights(model, os.path.join(directory, "ckpt-00000002.weights.npz"))
        for got, want in zip(model.variables, first.replicas[1].variables):
            np.testing.assert_array_equal(got, want)

    def test_a_skipped_step_skips_every_share(self):
        replicas, optimizer = _train(3, True, steps=1, nonfinite="skip")
        before = [v.numpy() for v in replicas.variables_of(2) + optimizer.slot_variables]

        @tf.function
        def poisoned(batch):
            return towers.train_step(
                lambda b: test_util.loss_fn(replicas.local())(b)[0] * np.nan,
                replicas, optimizer, batch, test_util.devices(3), nonfinite="skip",
            )  # fmt: skip

        poisoned(test_util.batch(11, seed=5))
        after = [v.numpy() for v in replicas.variables_of(2) + optimizer.slot_variables]
        for got, want in zip(after, before):
            np.testing.assert_array_equal(got, want)

    def test_the_hook_sees_every_gradient_and_accumulation_and_loss_scale_agree(self):
        def clip(grads, _):
            dense = [None if g is None else tf.convert_to_tensor(g) for g in grads]
            return tf.clip_by_global_norm(dense, 0.05)[0]

        options = dict(
            gradient_hook=clip,
            accumulate=None,
            loss_scale=towers.LossScale(64.0),
        )
        plain, _ = _train(3, False, **options)
        sharded, _ = _train(3, True, **options)
        for got, want in zip(sharded.replicas[1].variables, plain.replicas[0].variables):
            test_util.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
        plain, _ = _train(3, False, steps=4, accumulate=towers.GradientAccumulator(every=2))
        sharded, _ = _train(3, True, steps=4, accumulate=towers.GradientAccumulator(every=2))
        for got, want in zip(sharded.replicas[2].variables, plain.replicas[0].variables):
            test_util.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
        towers.check_replicas_identical(sharded)

    def test_bad_arguments(self):
        with self.assertRaisesRegex(ValueError, "a part of the accumulated mean"):
            _train(2, True, steps=1, gradient_hook=lambda g, v: g,
                   accumulate=towers.GradientAccumulator(every=2))  # fmt: skip

        class Unknown(tf.Module):
            def __init__(self):
                super().__init__()
                self.w = tf.Variable(tf.ones([2, 3]), shape=tf.TensorShape([None, 3]))

        with self.assertRaisesRegex(ValueError, r"must be static; \['Variable:0'\] have none"):
            towers.Replicated(Unknown, test_util.devices(2), shard_optimizer_state=True)

        class Twin(towers.ops.ReduceBroadcastAllReduce):  # as if another worker held as many
            def group_size(self, num_values):
                return 2 * num_values

        directory = os.path.join(self.get_temp_dir(), "elsewhere")
        with tf.Graph().as_default() as graph:  # the chief's gather is built into the graph
            replicas = towers.Replicated(
                test_util.built_model, test_util.devices(2), all_reduce=Twin(),
                shard_optimizer_state=True,
            )  # fmt: skip
            optimizer = towers.Adam(0.01)
            optimizer.build(replicas)
            graph.finalize()
            with tf.compat.v1.Session() as session:
                with self.assertRaisesRegex(ValueError, "before the graph is finalized"):
                    towers.CheckpointManager(directory, replicas, optimizer, session=session)

        with self.assertRaisesRegex(TypeError, "`shard_optimizer_state` must be True or False"):
            towers.Replicated(test_util.built_model, test_util.devices(2), shard_optimizer_state=1)
        self.assertIsNone(towers.Replicated(test_util.built_model, test_util.devices(2)).owners)


if __name__ == "__main__":
    tf.test.main()
