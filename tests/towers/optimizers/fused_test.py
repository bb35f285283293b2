"""The fused kernels' plain-op stand-ins compute what the kernels compute."""

from unittest import mock

import numpy as np
import tensorflow as tf
from absl.testing import parameterized

from tests import test_util
from tests.towers.optimizers import rules_test
from towers.ops import _programs
from towers.optimizers import _fused

FUSED = ("sgd", "momentum", "nesterov", "adam", "adamw", "rmsprop", "centered", "adagrad")


def _run(case: str, fused: bool, sparse: bool = False):
    """Ten updates of one variable; the variable and the op types of one update's graph."""
    make = rules_test.CASES[case][0]
    rng = np.random.default_rng(1)
    var = tf.Variable(rng.normal(size=(5, 3)).astype(np.float32), name="kernel")
    optimizer = make()

    @tf.function
    def update(grad):
        if sparse:  # rows 1 and 3, row 1 twice
            grad = tf.IndexedSlices(grad[:3], tf.constant([1, 3, 1]), tf.constant([5, 3]))
        optimizer.apply_gradients([(grad, var)])

    # (TensorFlow's kernels: on a GPU an uncompiled update is otherwise an XLA program.)
    with (
        mock.patch.object(_fused, "has_kernel", return_value=fused),
        mock.patch.object(_programs, "PROGRAM_DEVICES", frozenset()),
    ):
        grads = [tf.constant(rng.normal(size=(5, 3)).astype(np.float32)) for _ in range(10)]
        for grad in grads:
            update(grad)
        graph = update.get_concrete_function(grads[0]).graph
    return var.numpy(), {op.type for op in graph.get_operations()}


class PlainOpsTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.parameters(*FUSED)
    def test_plain_ops_equal_the_fused_kernel(self, case):
        fused, fused_ops = _run(case, fused=True)
        plain, plain_ops = _run(case, fused=False)
        self.assertTrue(any(t.startswith("ResourceApply") for t in fused_ops), fused_ops)
        self.assertFalse(any(t.startswith("ResourceApply") for t in plain_ops), plain_ops)
        test_util.assert_allclose(plain, fused, rtol=1e-6, atol=1e-7)

    def test_sparse_adagrad_plain_equals_its_kernel(self):
        fused, fused_ops = _run("adagrad", fused=True, sparse=True)
        plain, plain_ops = _run("adagrad", fused=False, sparse=True)
        self.assertIn("ResourceSparseApplyAdagradV2", fused_ops)
        self.assertNotIn("ResourceSparseApplyAdagradV2", plain_ops)
        test_util.assert_allclose(plain, fused, rtol=1e-6, atol=1e-7)

    def test_bfloat16_variables_update_on_every_device_of_the_tier(self):
        """A GPU has no fused bfloat16 kernel: its update is made of plain ops (soft placement
        is off in the GPU tier, so a fused op there would fail). On the CPU tier, whose CPUs
        have the kernel, this only checks an update happens: the GPU tier is its test."""
        for device in test_util.devices(2):
            for case in ("sgd", "momentum", "adagrad"):
                with tf.device(device):
                    var = tf.Variable(tf.ones([3], tf.bfloat16))
                rules_test.CASES[case][0]().apply_gradients([(tf.ones([3], tf.bfloat16), var)])
                self.assertLess(float(var[0]), 1.0)


if __name__ == "__main__":
    tf.test.main()
