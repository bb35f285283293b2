"""The suite's own set-up: what every process it starts gets from `tests/site/`."""

import tensorflow as tf

from tests import test_util


class SiteTest(tf.test.TestCase):
    def test_a_started_process_loads_keras_when_it_uses_it(self):
        out = test_util.run_python(
            "import sys\n"
            "import tensorflow as tf\n"
            "print('keras' in sys.modules)\n"
            "print(tf.keras.layers.Dense(3)(tf.ones([2, 2])).shape)\n"
            "import keras\n"
            "print(keras.optimizers.SGD.__name__, 'keras.src.optimizers' in sys.modules)\n",
            fresh=True,
        )
        self.assertEqual(out.split("\n")[:3], ["False", "(2, 3)", "SGD True"])


if __name__ == "__main__":
    tf.test.main()
