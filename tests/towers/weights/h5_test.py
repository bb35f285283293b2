"""`.h5` weight files are untrusted: nothing of another file is read, no bomb is allocated."""

import os
import time

import h5py
import numpy as np
import tensorflow as tf

import towers
from tests import test_util  # noqa: F401  (the process set-up)


class UntrustedH5Test(tf.test.TestCase):
    def setUp(self):
        super().setUp()
        self.dir = self.get_temp_dir()
        self.secret = os.path.join(self.dir, "secret.bin")
        np.arange(4, dtype=np.float32).tofile(self.secret)  # a user's file
        self.other = os.path.join(self.dir, "other.h5")
        with h5py.File(self.other, "w") as f:
            f["w"] = np.arange(4, dtype=np.float32)

    def _refused(self, path, message):
        with self.assertRaisesRegex(ValueError, message):
            towers.read_weights(path)
        with self.assertRaisesRegex(ValueError, message):
            towers.restore_weights({"w": tf.Variable(tf.zeros([4]))}, path)

    def test_external_raw_storage_is_refused(self):
        path = os.path.join(self.dir, "external.h5")
        with h5py.File(path, "w") as f:
            f.create_dataset("w", shape=(4,), dtype="f4", external=[(self.secret, 0, 16)])
        self._refused(path, "dataset 'w' reads its data from other files")

    def test_a_virtual_dataset_is_refused(self):
        path = os.path.join(self.dir, "virtual.h5")
        with h5py.File(path, "w") as f:
            layout = h5py.VirtualLayout(shape=(4,), dtype="f4")
            layout[:] = h5py.VirtualSource(self.other, "w", shape=(4,))
            f.create_virtual_dataset("w", layout)
        self._refused(path, "dataset 'w' reads its data from other files")

    def test_an_external_link_is_refused(self):
        path = os.path.join(self.dir, "link.h5")
        with h5py.File(path, "w") as f:
            f["w"] = h5py.ExternalLink(self.other, "w")
        self._refused(path, "links to other files: 'w' -> ")

    def test_a_dataset_declaring_gigabytes_in_a_small_file_is_refused_at_once(self):
        path = os.path.join(self.dir, "bomb.h5")
        with h5py.File(path, "w") as f:  # 4 GiB of float32 declared, nothing stored
            f.create_dataset("w", shape=(2**30,), dtype="f4", chunks=(2**20,), compression="gzip")
        self.assertLess(os.path.getsize(path), 10_000)
        began = time.monotonic()
        self._refused(path, r"declares 4294967296 bytes of arrays in \d+ bytes")
        self.assertLess(time.monotonic() - began, 5.0)

    def test_plain_files_still_read(self):
        self.assertAllEqual(towers.read_weights(self.other)["w"], [0.0, 1.0, 2.0, 3.0])


if __name__ == "__main__":
    tf.test.main()
