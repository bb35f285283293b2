"""The cifar10_multi_gpu_train porting example: a v1 Graph and Session against one device."""

import os

import numpy as np
import tensorflow as tf

import towers
from examples import port_cifar10_multi_gpu as cifar
from tests import test_util

BATCH, STEPS, LR = 30, 20, 0.1  # 30 over 4 towers: shards of 8, 8, 7, 7
# On GPUs in float64: in float32, cuDNN's convolutions round differently for a shard than for
# the whole batch, and 20 steps through ReLUs and max-pools (a value within round-off of a
# kink or a tie goes either way) grew that to 7e-4 relative on the H200 (3e-6 by step 3).
DTYPE = tf.float64 if test_util.KIND == "GPU" else tf.float32
RTOL = 1e-5 if DTYPE == tf.float32 else 1e-9


def _v1_reference(batch_size, steps, learning_rate, seed=0):
    """The same training written by hand in a v1 graph on one device: whole batch, plain SGD.

    On the tier's device, as the towers (a CPU's convolutions and a GPU's round differently).
    """
    images, labels = cifar.make_data(batch_size * 8, seed)
    images = images.astype(DTYPE.as_numpy_dtype)
    with tf.Graph().as_default() as graph, tf.device(test_util.reference_device()):
        image_ph = tf.compat.v1.placeholder(DTYPE, [None, 32, 32, 3])
        label_ph = tf.compat.v1.placeholder(tf.int32, [None])
        model = cifar.ConvNet(seed, DTYPE)
        logits = model(image_ph)
        log_p = tf.nn.log_softmax(logits)  # (dense: a GPU has no float64 sparse cross-entropy)
        loss = -tf.reduce_mean(tf.reduce_sum(tf.one_hot(label_ph, 10, dtype=DTYPE) * log_p, 1))
        variables = [model.conv1, model.conv2, model.dense, model.bias]
        grads = tf.compat.v1.gradients(loss, variables)
        update = tf.group([v.assign_sub(learning_rate * g) for v, g in zip(variables, grads)])
        with tf.compat.v1.Session(graph=graph, config=towers.session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            losses = []
            for step in range(steps):
                batch_images, batch_labels = cifar.batch_at(images, labels, step, batch_size)
                value, _ = sess.run(
                    [loss, update], {image_ph: batch_images, label_ph: batch_labels}
                )
                losses.append(value)
            weights = dict(zip(["conv1", "conv2", "dense", "bias"], sess.run(variables)))
    return losses, weights


class PortCifar10MultiGpuTest(tf.test.TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.reference_losses, cls.reference_weights = _v1_reference(BATCH, STEPS, LR)

    def _assert_like_reference(self, result, steps=STEPS):
        test_util.assert_allclose(
            result["losses"],
            self.reference_losses[steps - len(result["losses"]) : steps],
            rtol=RTOL,
            atol=RTOL / 10,
        )
        self.assertEqual(set(result["weights"]), set(self.reference_weights))
        for name, want in self.reference_weights.items():
            test_util.assert_allclose(result["weights"][name], want, rtol=RTOL, atol=RTOL)

    def test_four_towers_in_a_v1_session_equal_one_device(self):
        devices = cifar.choose_devices(4)  # the process already has 8: left as it is
        self.assertEqual(devices, test_util.devices(4))
        result = cifar.train(devices, BATCH, STEPS, LR, dtype=DTYPE)
        losses = result["losses"]
        self.assertLen(losses, STEPS)
        self.assertLess(np.mean(losses[-3:]), 0.5 * losses[0])
        self.assertEqual(result["global_step"], STEPS)
        self._assert_like_reference(result)

    def test_stage_by_stage_equals_one_device(self):
        result = cifar.train(test_util.devices(3), BATCH, STEPS, LR, stages=True, dtype=DTYPE)
        self.assertEqual(result["global_step"], STEPS)
        self._assert_like_reference(result)

    def test_resumes_from_a_checkpoint_and_its_weights_load_eagerly(self):
        directory = os.path.join(self.get_temp_dir(), "run")
        first = cifar.train(
            test_util.devices(4), BATCH, 10, LR, checkpoint_dir=directory, save_every=5, dtype=DTYPE
        )
        self.assertEqual(first["global_step"], 10)
        resumed = cifar.train(
            test_util.devices(2),
            BATCH,
            STEPS,
            LR,
            checkpoint_dir=directory,
            save_every=5,
            dtype=DTYPE,
        )
        self.assertLen(resumed["losses"], STEPS - 10)
        self.assertEqual(resumed["global_step"], STEPS)
        self._assert_like_reference(resumed)
        self.assertEqual(resumed["kept"], [10, 15, 20])

        model = cifar.ConvNet(seed=7, dtype=DTYPE)  # eager, one device
        towers.restore_weights(model, resumed["weights_path"])
        for name, want in self.reference_weights.items():
            test_util.assert_allclose(getattr(model, name), want, rtol=RTOL, atol=RTOL)


if __name__ == "__main__":
    tf.test.main()
