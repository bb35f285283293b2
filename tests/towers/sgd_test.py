import numpy as np
import tensorflow as tf

import towers
from tests import test_util  # noqa: F401  (the test process's devices)


class SGDTest(tf.test.TestCase):
    def test_dense_and_sparse_updates(self):
        var = tf.Variable(np.ones([4, 2], np.float32))
        sgd = towers.SGD(0.5)
        sgd.apply_gradients([(tf.fill([4, 2], 2.0), var)])
        self.assertAllClose(var, np.zeros([4, 2]))
        rows = tf.IndexedSlices(tf.ones([3, 2]), tf.constant([1, 1, 3]), tf.constant([4, 2]))
        sgd.apply_gradients([(rows, var), (None, tf.Variable(1.0))])
        self.assertAllClose(var, [[0, 0], [-1, -1], [0, 0], [-0.5, -0.5]])

    def test_momentum(self):
        var = tf.Variable([1.0])
        sgd = towers.SGD(0.1, momentum=0.5)
        for _ in range(2):
            sgd.apply_gradients([(tf.constant([1.0]), var)])
        # velocity 1 then 1.5: 1 - 0.1 - 0.15
        self.assertAllClose(var, [0.75])
        self.assertEqual(list(sgd.slots), [var.name.split(":")[0]])
        self.assertLen(sgd.variables, 1)

    def test_bad_learning_rates(self):
        for rate, error, message in [
            ("fast", TypeError, "`learning_rate` must be a number, .* got 'fast'"),
            (None, TypeError, "`learning_rate` must be a number"),
            (-0.1, ValueError, "`learning_rate` must be >= 0; got -0.1"),
            (tf.constant([0.1, 0.2]), TypeError, r"floating scalar; got float32 of shape \(2,\)"),
        ]:
            with self.assertRaisesRegex(error, message):
                towers.SGD(rate)
        with self.assertRaisesRegex(TypeError, "`momentum` must be a number"):
            towers.SGD(0.1, momentum="0.9")
        towers.SGD(tf.Variable(0.1))  # a variable (a schedule written by hand) is fine

    def test_bad_momentum(self):
        with self.assertRaisesRegex(ValueError, "got momentum=1.0"):
            towers.SGD(0.1, momentum=1.0)


if __name__ == "__main__":
    tf.test.main()
