import tensorflow as tf

from towers import ops


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


if __name__ == "__main__":
    tf.test.main()
