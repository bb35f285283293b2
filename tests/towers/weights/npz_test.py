"""`.npz` weight files are untrusted: what a member declares is checked before allocating."""

import io
import os
import time
import zipfile

import numpy as np
import tensorflow as tf

import towers
from tests import test_util  # noqa: F401  (the process set-up)


def _npz_declaring(path, shape, data=b""):
    """An `.npz` whose one member's header declares `shape` float32 and holds `data`."""
    header = io.BytesIO()
    fields = {"descr": "<f4", "fortran_order": False, "shape": shape}
    np.lib.format.write_array_header_1_0(header, fields)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("w.npy", header.getvalue() + data)


class UntrustedNpzTest(tf.test.TestCase):
    def test_a_member_declaring_terabytes_is_refused_at_once(self):
        path = os.path.join(self.get_temp_dir(), "bomb.npz")
        _npz_declaring(path, (2**40,))  # 4 TiB of float32 in a few hundred bytes
        began = time.monotonic()
        with self.assertRaisesRegex(ValueError, r"declares \(1099511627776,\) float32"):
            towers.read_weights(path)
        self.assertLess(time.monotonic() - began, 5.0)

    def test_a_member_declaring_more_than_it_holds_is_refused(self):
        path = os.path.join(self.get_temp_dir(), "short.npz")
        _npz_declaring(path, (1000,), data=np.zeros(10, np.float32).tobytes())
        with self.assertRaisesRegex(ValueError, r"declares \(1000,\) float32 \(4000 bytes\)"):
            towers.read_weights(path)

    def test_a_compressed_file_within_bounds_still_reads(self):
        path = os.path.join(self.get_temp_dir(), "zeros.npz")
        np.savez_compressed(path, w=np.zeros([256, 256], np.float32))  # 256 KiB in ~300 bytes
        self.assertAllEqual(towers.read_weights(path)["w"], np.zeros([256, 256]))


if __name__ == "__main__":
    tf.test.main()
