"""The multi_gpu_model porting example: Keras layers, synchronized BatchNorm, real digits."""

import os

import tensorflow as tf

import towers
from examples import port_multi_gpu_model as digits
from tests import test_util

STEPS = 60


def _weights(model):
    return {name: var.numpy() for name, var in towers.named_variables(model).items()}


class PortMultiGpuModelTest(tf.test.TestCase):
    _four = None

    def _four_towers(self):
        """The uninterrupted 4-tower run both tests compare with, made once (a trace: seconds),
        in a test (after `setUp` set the seeds, as for each run it is compared with). How
        often it evaluates changes no weight: evaluation neither trains nor moves BatchNorm's
        averages, and reads its own data."""
        if PortMultiGpuModelTest._four is None:
            PortMultiGpuModelTest._four = digits.train(
                test_util.devices(4), STEPS, batch_size=50, eval_every=STEPS, smooth=True
            )
        return PortMultiGpuModelTest._four

    def test_four_towers_learn_like_one(self):
        """Synchronized BatchNorm keeps the equivalence: 4 towers train the 1-tower model.

        Smooth (no relu or max pooling kinks): on the GPU tier the relu model's weights came
        out 2.5e-3 apart in 1 run of 2, from inputs within round-off of a kink.
        """
        devices = digits.choose_devices(4)
        self.assertEqual(devices, test_util.devices(4))  # those of the shared run
        four = self._four_towers()
        one = digits.train(devices[:1], STEPS, batch_size=50, eval_every=STEPS, smooth=True)
        self.assertGreater(four["accuracy"], 0.8)
        self.assertAllClose(four["accuracy"], one["accuracy"], atol=0.02)
        want = _weights(one["model"])
        self.assertIn("bn1/moving_mean", want)
        self.assertIn("conv1/kernel", want)
        for name, value in _weights(four["model"]).items():
            test_util.assert_allclose(value, want[name], rtol=1e-3, atol=1e-4)

    def test_resume_keeps_the_best_and_equals_an_uninterrupted_run(self):
        """Resumed on 3 towers, as the 4 would have gone on. Smooth, as above: on the GPU
        tier the relu model's weights came out 3.6e-4 apart in 1 run of 3."""
        directory = os.path.join(self.get_temp_dir(), "run")
        devices, whole = test_util.devices(4), self._four_towers()
        digits.train(
            devices,
            STEPS,
            50,
            eval_every=10,
            checkpoint_dir=directory,
            stop_after=STEPS // 2,
            smooth=True,
        )
        with self.assertRaisesRegex(ValueError, "pass --resume"):
            digits.train(devices, STEPS, 50, checkpoint_dir=directory, smooth=True)
        resumed = digits.train(
            devices[:3], STEPS, 50, eval_every=10, checkpoint_dir=directory, resume=True,
            smooth=True,
        )  # fmt: skip
        self.assertLen(resumed["losses"], STEPS // 2)
        test_util.assert_allclose(resumed["losses"], whole["losses"][STEPS // 2 :], rtol=1e-4)
        want = _weights(whole["model"])
        for name, value in _weights(resumed["model"]).items():
            test_util.assert_allclose(value, want[name], rtol=1e-4, atol=1e-5)
        best = digits.DigitsNet(seed=9)
        best(tf.zeros([1, 8, 8, 1]), training=False)
        self.assertTrue(towers.restore_weights(best, resumed["best_weights"]).complete)


if __name__ == "__main__":
    tf.test.main()
