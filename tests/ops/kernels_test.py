"""`has_kernel`: TensorFlow's kernel registry, asked while the graph is built."""

import tensorflow as tf

from towers.ops.internal import has_kernel


class HasKernelTest(tf.test.TestCase):
    def test_cpus_have_what_gpus_lack(self):
        self.assertTrue(has_kernel("SplitV", "/device:CPU:3", T=tf.int64))
        self.assertTrue(has_kernel("ResourceApplyGradientDescent", "/cpu:0", T=tf.bfloat16))
        self.assertTrue(has_kernel("SplitV", "/job:worker/task:1/device:CPU:0", T=tf.float32))

    def test_a_dtype_no_kernel_takes(self):
        self.assertFalse(has_kernel("ResourceApplyAdam", "/device:CPU:0", T=tf.int32))
        self.assertFalse(has_kernel("NoSuchOpAnywhere", "/device:CPU:0"))

    def test_no_device_takes_any_kernel(self):
        self.assertTrue(has_kernel("SplitV", None, T=tf.int64))
        self.assertTrue(has_kernel("SplitV", "", T=tf.float32))

    def test_what_gpus_lack(self):
        """What the GPU tier found missing with soft placement off: SplitV of int64, fused
        updates of bfloat16. (TensorFlow's CPU build registers the GPU kernels too, so this
        holds on every machine.)"""
        gpu = "/job:localhost/replica:0/task:0/device:GPU:1"
        self.assertTrue(has_kernel("SplitV", gpu, T=tf.float32))
        self.assertFalse(has_kernel("SplitV", gpu, T=tf.int64))
        self.assertTrue(has_kernel("ResourceApplyGradientDescent", gpu, T=tf.float32))
        self.assertFalse(has_kernel("ResourceApplyGradientDescent", gpu, T=tf.bfloat16))
        self.assertFalse(has_kernel("ResourceSparseApplyMomentum", gpu, T=tf.float32))
        self.assertTrue(has_kernel("CollectiveReduceV2", gpu, T=tf.float32))  # any device


if __name__ == "__main__":
    tf.test.main()
