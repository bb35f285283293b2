import statistics

import tensorflow as tf

from examples import quickstart
from tests import test_util


class QuickstartTest(tf.test.TestCase):
    def test_trains_on_four_towers_and_matches_one_device(self):
        # The test process already has 8 logical devices; asking for them again is a no-op.
        devices = quickstart.choose_devices(test_util.NUM_DEVICES)[:4]
        self.assertEqual(devices, test_util.devices(4))
        result = quickstart.train(devices, batch_size=30, steps=12, learning_rate=0.2)
        self.assertLen(result["losses"], 12)
        self.assertLess(statistics.mean(result["losses"][-3:]), result["losses"][0])
        self.assertLen(result["step_seconds"], 11)
        single = quickstart.train(devices[:1], batch_size=30, steps=12, learning_rate=0.2)
        for got, want in zip(result["model"].variables, single["model"].variables):
            test_util.assert_allclose(got, want, rtol=1e-4, atol=1e-5)

    def test_data_is_deterministic_and_balanced(self):
        images, labels = quickstart.make_data(1000, seed=3)
        again, _ = quickstart.make_data(1000, seed=3)
        self.assertAllEqual(images, again)
        self.assertEqual(images.shape, (1000, quickstart.IMAGE, quickstart.IMAGE, 1))
        self.assertGreater(min(tf.math.bincount(labels).numpy()), 60)


if __name__ == "__main__":
    tf.test.main()
