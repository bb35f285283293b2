"""Whether a placement is on a device, or in its task (`towers.ops._device_scope`)."""

import tensorflow as tf

from tests import test_util  # noqa: F401  (the process set-up)
from towers.ops import internal


class PlacementTest(tf.test.TestCase):
    def test_holds_compares_the_device_and_the_task_it_names(self):
        placed = "/job:localhost/replica:0/task:0/device:GPU:1"
        self.assertTrue(internal.holds("/device:GPU:1", placed))
        self.assertTrue(internal.holds("/job:localhost/task:0/device:GPU:1", placed))
        self.assertFalse(internal.holds("/device:GPU:0", placed))
        self.assertFalse(internal.holds("/device:CPU:1", placed))
        self.assertFalse(internal.holds("/job:worker/device:GPU:1", placed))
        self.assertFalse(internal.holds("/job:localhost/task:1/device:GPU:1", placed))
        self.assertFalse(internal.holds("/device:GPU:1", ""))  # (unplaced)

    def test_in_task_ignores_the_device_and_compares_what_the_name_gives(self):
        placed = "/job:localhost/replica:0/task:0/device:GPU:1"
        for device in (None, "", "/device:CPU:0", "/job:localhost", "/job:localhost/task:0"):
            self.assertTrue(internal.in_task(device, placed), device)
        for device in ("/job:worker", "/job:localhost/task:1", "/job:localhost/replica:1"):
            self.assertFalse(internal.in_task(device, placed), device)


if __name__ == "__main__":
    tf.test.main()
