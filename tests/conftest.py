"""Every test process sees 8 logical CPU devices, with TensorFlow's log noise quieted."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # INFO and WARNING from C++; errors stay.

import tensorflow as tf  # noqa: E402

import towers  # noqa: E402
from tests import test_util  # noqa: E402

tf.get_logger().setLevel("ERROR")
# The suite runs the same on any machine: GPUs hidden, one CPU split into 8 logical devices.
tf.config.set_visible_devices([], "GPU")
towers.simulate_devices(test_util.NUM_DEVICES)


def pytest_collection_modifyitems(items):
    """Drops `tf.test.TestCase.test_session`, a context manager pytest mistakes for a test."""
    items[:] = [item for item in items if item.name != "test_session"]
