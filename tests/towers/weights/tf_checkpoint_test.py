"""TensorFlow checkpoint directories are untrusted: their state file names only their own."""

import os
import sys
import textwrap
import time
from unittest import mock

import numpy as np
import tensorflow as tf

import towers
from tests import forked, test_util
from towers.weights import _tf_checkpoint


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


class ReadWhileSavedTest(tf.test.TestCase):
    def test_a_read_follows_a_save_that_switches_the_checkpoint_under_it(self):
        """The state file named a checkpoint another save has just replaced and deleted.

        Before: `FileNotFoundError` ("a directory without a TensorFlow checkpoint").
        """
        path = os.path.join(self.get_temp_dir(), "switched")
        towers.save_weights({"w": tf.Variable([1.0, 1.0])}, path)
        latest = tf.train.latest_checkpoint
        calls = []

        def racing(directory):
            calls.append(directory)
            if len(calls) == 1:  # another process saves between the two looks
                towers.save_weights({"w": tf.Variable([2.0, 2.0])}, path)
                return None  # the checkpoint it had read the name of is gone
            return latest(directory)

        with mock.patch.object(_tf_checkpoint.tf.train, "latest_checkpoint", racing):
            np.testing.assert_array_equal(towers.read_weights(path)["w"], [2.0, 2.0])
        self.assertLen(calls, 2)

    def test_a_missing_checkpoint_is_an_error_at_once(self):
        path = os.path.join(self.get_temp_dir(), "missing")
        towers.save_weights({"w": tf.Variable([1.0])}, path)
        for name in os.listdir(path):
            if name.startswith("weights-"):
                os.remove(os.path.join(path, name))
        began = time.monotonic()
        with self.assertRaisesRegex(FileNotFoundError, "without a TensorFlow checkpoint"):
            towers.read_weights(path)
        self.assertLess(time.monotonic() - began, 5.0)

    def test_reads_while_another_process_saves_get_old_or_new_weights(self):
        path = os.path.join(self.get_temp_dir(), "busy")
        towers.save_weights({"w": tf.Variable(np.zeros(1000, np.float32))}, path)
        writer = textwrap.dedent(f"""
            import os, time
            os.environ["CUDA_VISIBLE_DEVICES"] = ""
            import numpy as np, tensorflow as tf, towers
            print("ready", flush=True)
            end = time.monotonic() + 2.5
            i = 0
            while time.monotonic() < end:
                i += 1
                towers.save_weights({{"w": tf.Variable(np.full(1000, i, np.float32))}}, {path!r})
            print(i)
        """)
        saver = forked.Popen(
            [sys.executable, "-c", writer], env=test_util.child_env(), stdout=forked.PIPE
        )
        reads = 0
        try:
            self.assertEqual(saver.stdout.readline().strip(), b"ready")  # (then it saves)
            while saver.poll() is None:
                w = towers.read_weights(path)["w"]
                self.assertEqual(len(set(w.tolist())), 1)  # one save's, never mixed
                reads += 1
        finally:
            saves = int(saver.communicate(timeout=60)[0])
        self.assertGreater(saves, 10)
        self.assertGreater(reads, 10)


if __name__ == "__main__":
    tf.test.main()
