import contextlib
from unittest import mock

import tensorflow as tf

import towers
from tests import test_util

CPUS = [f"/device:CPU:{i}" for i in range(test_util.NUM_DEVICES)]
GPU_TIER = test_util.KIND == "GPU"  # 8 logical GPUs beside the 8 CPUs


class ListDevicesTest(tf.test.TestCase):
    def test_gpus_when_there_are_any_else_the_cpu_logical_devices(self):
        self.assertEqual(towers.list_devices(), test_util.devices(test_util.NUM_DEVICES))
        self.assertEqual(towers.list_devices("cpu"), CPUS)
        if not GPU_TIER:
            self.assertEqual(towers.list_devices(), CPUS)

    def test_num_takes_the_first_devices(self):
        self.assertEqual(towers.list_devices(num=3), test_util.devices(3))
        self.assertEqual(towers.list_devices("CPU", num=2), CPUS[:2])

    def test_more_devices_than_exist_lists_what_exists(self):
        kind = test_util.KIND
        with self.assertRaisesRegex(
            ValueError, rf"Asked for 9 {kind} devices but only 8 exist: \[.*'/device:{kind}:0'.*sim"
        ):
            towers.list_devices(num=9)

    def test_gpus_of_this_tier(self):
        self.assertEqual(towers.list_devices("GPU"), test_util.devices(8) if GPU_TIER else [])
        if not GPU_TIER:
            with self.assertRaisesRegex(ValueError, "Asked for 1 GPU devices but only 0 exist"):
                towers.list_devices("GPU", num=1)

    def test_bad_arguments(self):
        with self.assertRaisesRegex(
            ValueError, r"`kind` must be one of \('CPU', 'GPU'\); got 'TPU'"
        ):
            towers.list_devices("TPU")
        with self.assertRaisesRegex(ValueError, "`num` must be an int >= 1; got 0"):
            towers.list_devices(num=0)


class SimulateDevicesTest(tf.test.TestCase):
    def test_same_layout_again_is_a_no_op(self):
        towers.simulate_devices(test_util.NUM_DEVICES)
        self.assertLen(towers.list_devices(), test_util.NUM_DEVICES)

    def test_another_layout_after_initialization(self):
        with self.assertRaisesRegex(
            RuntimeError, "Cannot simulate 4 CPU devices: TensorFlow is already initialized with 8"
        ):
            towers.simulate_devices(4)

    def test_gpu_needs_a_memory_limit(self):
        with self.assertRaisesRegex(ValueError, "needs `memory_limit_mb`"):
            towers.simulate_devices(2, "GPU")

    def test_missing_physical_device(self):
        """The CPU tier has no GPU (hidden); the GPU tier's is hidden from the call here."""
        none = mock.patch.object(tf.config, "list_physical_devices", return_value=[])
        with none if GPU_TIER else contextlib.nullcontext():
            with self.assertRaisesRegex(
                ValueError, "No physical GPU device to split; this machine has"
            ):
                towers.simulate_devices(2, "GPU", memory_limit_mb=1024)

    def test_bad_num(self):
        for num, error in ((0, ValueError), (-1, ValueError), (2.0, TypeError), (True, TypeError)):
            with self.assertRaisesRegex(error, "`num` must be an int >= 1"):
                towers.simulate_devices(num)

    def test_fresh_process(self):
        """Before initialization it configures; a second different call is refused after."""
        code = (
            "import os; os.environ['TF_CPP_MIN_LOG_LEVEL'] = '2'\n"
            "import towers\n"
            "towers.simulate_devices(3)\n"
            "print(len(towers.list_devices()))\n"
            "towers.simulate_devices(3)\n"
            "try:\n"
            "    towers.simulate_devices(5)\n"
            "except RuntimeError as e:\n"
            "    print('refused')\n"
        )
        self.assertEqual(test_util.run_python(code).split(), ["3", "refused"])


class CanonicalDeviceTest(tf.test.TestCase):
    def test_normalizes(self):
        self.assertEqual(towers.canonical_device("/gpu:1"), "/device:GPU:1")
        self.assertEqual(
            towers.canonical_device(tf.DeviceSpec(device_type="CPU", device_index=2)),
            "/device:CPU:2",
        )
        self.assertEqual(
            towers.canonical_device(tf.config.list_logical_devices()[3]), "/device:CPU:3"
        )

    def test_errors(self):
        with self.assertRaisesRegex(ValueError, "must name its type and index"):
            towers.canonical_device("/job:worker")
        with self.assertRaisesRegex(ValueError, "Cannot parse device 'gpu0'"):
            towers.canonical_device("gpu0")
        with self.assertRaisesRegex(TypeError, "got 3"):
            towers.canonical_device(3)


def _gpus(*names):
    return [tf.config.PhysicalDevice(f"/physical_device:GPU:{i}", "GPU") for i in names]


class SessionConfigTest(tf.test.TestCase):
    def test_v1_session_sees_the_logical_devices(self):
        config = towers.session_config()
        self.assertEqual(config.device_count["CPU"], test_util.NUM_DEVICES)
        self.assertFalse(config.allow_soft_placement)
        last = test_util.devices(test_util.NUM_DEVICES)[-1]
        with tf.Graph().as_default():
            with tf.device("/cpu:7"):
                x = tf.constant(2.0) * 3.0
            with tf.device(last):
                y = x * 2.0
            with tf.compat.v1.Session(config=config) as sess:
                gpus = test_util.NUM_DEVICES if test_util.KIND == "GPU" else 0
                self.assertLen(sess.list_devices(), test_util.NUM_DEVICES + gpus)
                self.assertEqual(sess.run(y), 12.0)

    def test_sessions_get_the_logical_gpus_of_tf_config(self):
        """Two physical GPUs, the second hidden, the first split in two: the same in v1."""
        split = [tf.config.LogicalDeviceConfiguration(memory_limit=m) for m in (1000, 2000)]
        with (
            mock.patch.object(tf.config, "list_physical_devices", return_value=_gpus(0, 1)),
            mock.patch.object(tf.config, "get_visible_devices", return_value=_gpus(1)),
            mock.patch.object(tf.config, "get_logical_device_configuration", return_value=split),
        ):
            options = towers.session_config().gpu_options
        self.assertEqual(options.visible_device_list, "1")
        (entry,) = options.experimental.virtual_devices
        self.assertEqual(list(entry.memory_limit_mb), [1000, 2000])

    def test_sessions_see_no_gpu_that_tf_config_hides(self):
        with (
            mock.patch.object(tf.config, "list_physical_devices", return_value=_gpus(0)),
            mock.patch.object(tf.config, "get_visible_devices", return_value=[]),
        ):
            config = towers.session_config()
        self.assertEqual(config.device_count["GPU"], 0)
        self.assertEmpty(config.gpu_options.experimental.virtual_devices)

    def test_bad_num(self):
        with self.assertRaisesRegex(ValueError, "`num_cpus` must be an int >= 1; got 0"):
            towers.session_config(0)


if __name__ == "__main__":
    tf.test.main()
