import tensorflow as tf
from absl.testing import parameterized

from tests import test_util
from towers import ops

ALGORITHMS = ("reduce_broadcast", "ring", "collective", "hierarchical", "auto")


def _averaged(grads, variables=None, bucket_bytes=None):
    return ops.average_gradients(grads, [1, 1], variables=variables, bucket_bytes=bucket_bytes)


def _all_reduced(grads, variables=None, bucket_bytes=None, algorithm="ring"):
    return ops.all_reduce_gradients(
        grads,
        test_util.devices(2),
        variables=variables,
        bucket_bytes=bucket_bytes,
        algorithm=algorithm,
    )


class GradListTest(tf.test.TestCase):
    def test_split_and_merge_are_inverse(self):
        v1, v2 = tf.Variable(1.0), tf.Variable(2.0)
        pairs = [[(tf.constant(1.0), v1), (None, v2)], [(tf.constant(3.0), v1), (None, v2)]]
        grads, variables = ops.split_grad_list(pairs)
        self.assertEqual([len(g) for g in grads], [2, 2])
        self.assertIs(variables[1][0], v1)
        self.assertEqual(ops.merge_grad_list(grads, variables), pairs)

    def test_split_errors(self):
        v = tf.Variable(1.0)
        with self.assertRaisesRegex(ValueError, "tower 0 has 1 and tower 1 has 2"):
            ops.split_grad_list([[(None, v)], [(None, v), (None, v)]])
        with self.assertRaisesRegex(ValueError, r"Tower 0 must hold \(gradient, variable\) pairs"):
            ops.split_grad_list([[tf.constant(1.0)]])

    def test_merge_errors(self):
        with self.assertRaisesRegex(ValueError, "got 2 and 1"):
            ops.merge_grad_list([[None], [None]], [[None]])
        with self.assertRaisesRegex(ValueError, "Tower 0 has 2 gradients for 1 variables"):
            ops.merge_grad_list([[None, None]], [[None]])


class ColumnChecksTest(tf.test.TestCase, parameterized.TestCase):
    """Gradients of one variable that disagree across towers are refused, never converted.

    Before: integer gradients averaged to 0 ([4, 8] with weights 1/2 cast to int), shapes
    [2, 3] and [3, 2] came back as tower 0's, float64 was cast to tower 0's float32, and a
    gradient of another shape than its variable passed to fail in the update kernel."""

    @parameterized.product(reduce=[_averaged, _all_reduced], bucket_bytes=[None, 2**20])
    def test_disagreeing_towers_are_refused_when_built(self, reduce, bucket_bytes):
        cases = (
            ([[tf.constant([4, 8])], [tf.constant([4, 8])]], TypeError, "int32: gradients"),
            ([[tf.ones([2, 3])], [tf.ones([3, 2])]], ValueError, r"float32\(2, 3\) and tower 1"),
            (
                [[tf.ones([2], tf.float32)], [tf.ones([2], tf.float64)]],
                ValueError,
                "tower 1 float64",
            ),
            (
                [[tf.ones([2], tf.bfloat16)], [tf.ones([2], tf.float32)]],
                ValueError,
                "tower 0 has bfloat16",
            ),
        )
        for grads, error, message in cases:
            with self.subTest(message=message):
                with self.assertRaisesRegex(error, message):
                    reduce(grads, bucket_bytes=bucket_bytes)

    @parameterized.product(reduce=[_averaged, _all_reduced], bucket_bytes=[None, 2**20])
    def test_a_gradient_must_fit_its_variable(self, reduce, bucket_bytes):
        variable = tf.Variable(tf.zeros([3]), name="kernel")
        grads = [[tf.ones([4])], [tf.ones([4])]]
        with self.assertRaisesRegex(ValueError, r"kernel.* the variable has float32\(3,\)"):
            reduce(grads, variables=[variable], bucket_bytes=bucket_bytes)
        sparse = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([0]), tf.constant([3, 3]))
        matrix = tf.Variable(tf.zeros([3, 3]), name="table")
        with self.assertRaisesRegex(ValueError, r"table.*tower 0 float32\(None, 2\)"):
            reduce([[sparse], [sparse]], variables=[matrix], bucket_bytes=bucket_bytes)

    @parameterized.parameters(*ALGORITHMS)
    def test_half_precision_results_are_on_their_towers(self, algorithm):
        """Before: the cast back to float16 had no device (CPU:0 in a v1 session)."""
        devices = test_util.devices(2)
        with tf.Graph().as_default():
            grads = []
            for device in devices:
                with tf.device(device):
                    grads.append([tf.ones([4], tf.float16), tf.ones([2], tf.bfloat16)])
            reduced = ops.all_reduce_gradients(grads, devices, algorithm=algorithm)
            for tower, device in zip(reduced, devices):
                for grad in tower:
                    self.assertEqual(test_util.local_device(grad.device), device)


if __name__ == "__main__":
    tf.test.main()
