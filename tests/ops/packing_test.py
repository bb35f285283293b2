import numpy as np
import tensorflow as tf

from towers import ops


class PackingTest(tf.test.TestCase):
    def test_buckets_by_bytes_and_dtype_in_order(self):
        tensors = [
            tf.zeros([10]),
            tf.zeros([20]),
            tf.zeros([5], tf.float16),
            tf.zeros([30]),
            tf.zeros([100]),
        ]
        spec = ops.pack_spec(tensors, bucket_bytes=160)  # 40 float32 values
        self.assertEqual(spec.buckets, ((0, 1), (2,), (3,), (4,)))

    def test_a_large_tensor_alone_leaves_the_small_ones_around_it_together(self):
        tensors = [tf.zeros([4]), tf.zeros([100]), tf.zeros([4]), tf.zeros([4])]
        spec = ops.pack_spec(tensors, bucket_bytes=160)
        self.assertEqual(spec.buckets, ((0, 2, 3), (1,)))

    def test_round_trip(self):
        rng = np.random.default_rng(0)
        shapes = [(3, 4), (5,), (2, 2, 2), (1,), (7, 1)]
        tensors = [tf.constant(rng.normal(size=s), tf.float32) for s in shapes]
        spec = ops.pack_spec(tensors, bucket_bytes=64)
        packed = ops.pack(tensors, spec)
        self.assertEqual([b.shape.rank for b in packed], [1] * len(spec.buckets))
        self.assertEqual(sum(b.shape[0] for b in packed), sum(int(np.prod(s)) for s in shapes))
        for got, want in zip(ops.unpack(packed, spec), tensors):
            self.assertAllEqual(got, want)

    def test_a_hundred_variables_pack_into_one_bucket(self):
        tensors = [tf.zeros([32, 32]) if i % 2 else tf.zeros([32]) for i in range(100)]
        self.assertLen(ops.pack_spec(tensors, bucket_bytes=4 * 2**20).buckets, 1)

    def test_errors(self):
        with self.assertRaisesRegex(ValueError, "positive int; got 0"):
            ops.pack_spec([tf.zeros([2])], 0)

        @tf.function(input_signature=[tf.TensorSpec([None])])
        def dynamic(x):
            return ops.pack_spec([x], 16)

        with self.assertRaisesRegex(ValueError, r"static shapes; tensor #0 has shape \(None,\)"):
            dynamic.get_concrete_function()


if __name__ == "__main__":
    tf.test.main()
