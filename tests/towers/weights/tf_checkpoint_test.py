"""TensorFlow checkpoint directories are untrusted: their state file names only their own."""

import os

import numpy as np
import tensorflow as tf

import towers
from tests import test_util  # noqa: F401  (the process set-up)


class UntrustedCheckpointDirectoryTest(tf.test.TestCase):
    def test_a_state_file_naming_a_checkpoint_elsewhere_is_refused(self):
        outside = os.path.join(self.get_temp_dir(), "outside")
        towers.save_weights({"w": tf.Variable([7.0, 7.0])}, outside)  # another directory
        (prefix,) = {n.rsplit(".", 1)[0] for n in os.listdir(outside) if ".index" in n}
        forged = os.path.join(self.get_temp_dir(), "forged")
        towers.save_weights({"w": tf.Variable([1.0, 1.0])}, forged)
        with open(os.path.join(forged, "checkpoint"), "w") as f:
            f.write(f'model_checkpoint_path: "{os.path.join(outside, prefix)}"\n')
        with self.assertRaisesRegex(ValueError, "names .*outside.*, outside the directory"):
            towers.read_weights(forged)
        target = {"w": tf.Variable([0.0, 0.0])}
        with self.assertRaisesRegex(ValueError, "outside the directory"):
            towers.restore_weights(target, forged)
        self.assertAllEqual(target["w"], [0.0, 0.0])

    def test_its_own_checkpoint_reads(self):
        path = os.path.join(self.get_temp_dir(), "mine")
        towers.save_weights({"w": tf.Variable([1.0, 2.0])}, path)
        np.testing.assert_array_equal(towers.read_weights(path)["w"], [1.0, 2.0])


if __name__ == "__main__":
    tf.test.main()
