"""The Mask R-CNN ParallelModel porting example: named outputs merged by name, weights reloaded."""

import os
import statistics

import numpy as np
import tensorflow as tf

import towers
from examples import port_mask_rcnn
from tests import test_util


def _hand_losses(outputs, batch):
    """Class cross-entropy and foreground smooth-L1 box loss, written out in numpy."""
    logits = np.asarray(outputs["class_logits"], np.float64)
    labels = np.asarray(batch["labels"])
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    class_loss = -log_probs[np.arange(len(labels)), labels].mean()
    diff = np.asarray(batch["boxes"], np.float64) - np.asarray(outputs["box_deltas"], np.float64)
    smooth = np.where(np.abs(diff) < 1.0, 0.5 * diff**2, np.abs(diff) - 0.5).sum(axis=1)
    box_loss = ((labels > 0) * smooth).mean()
    return class_loss, box_loss


class PortMaskRcnnTest(tf.test.TestCase):
    def test_named_outputs_on_four_towers_equal_a_single_device_model(self):
        devices = port_mask_rcnn.choose_devices(4)  # the process already has 8: left as it is
        self.assertEqual(devices, test_util.devices(4))
        # 30 over 4 towers: shards of 8, 8, 7, 7, so the loss means must be size-weighted.
        result = port_mask_rcnn.train(devices, batch_size=30, steps=12, learning_rate=0.1)
        losses = result["losses"]
        self.assertLess(statistics.mean(losses[-3:]), 0.5 * losses[0])
        for total, cls, box in zip(losses, result["class_losses"], result["box_losses"]):
            self.assertAllClose(total, cls + port_mask_rcnn.BOX_LOSS_WEIGHT * box, rtol=1e-6)

        path = os.path.join(self.get_temp_dir(), "detector.h5")
        towers_model = result["model"]
        towers.save_weights(towers_model, path)
        batch = port_mask_rcnn.batch_at(result["data"], 12, 30)
        loss, merged = result["step"](batch)  # outputs from the saved weights, then an update
        single = port_mask_rcnn.load_single_device(path)
        with tf.device("/cpu:0"):
            heads = single(batch["features"])
        self.assertEqual(set(merged), set(port_mask_rcnn.MERGE))
        for name in ("class_logits", "box_deltas"):
            self.assertEqual(merged[name].shape[0], 30)
            test_util.assert_allclose(merged[name], heads[name], rtol=1e-5, atol=1e-5)
        class_loss, box_loss = _hand_losses(heads, batch)
        test_util.assert_allclose(merged["class_loss"], class_loss, rtol=1e-5, atol=1e-6)
        test_util.assert_allclose(merged["box_loss"], box_loss, rtol=1e-5, atol=1e-6)
        test_util.assert_allclose(loss, class_loss + box_loss, rtol=1e-5, atol=1e-6)

        predicted = port_mask_rcnn.predict_on_towers(single, batch["features"], devices[:3])
        test_util.assert_allclose(predicted["class_logits"], heads["class_logits"], atol=1e-6)

    def test_weights_carry_no_tower_prefix(self):
        path = os.path.join(self.get_temp_dir(), "detector.npz")
        result = port_mask_rcnn.train(test_util.devices(2), 8, 1, 0.1)
        towers.save_weights(result["model"], path)
        self.assertEqual(
            sorted(towers.read_weights(path)),
            ["box_b", "box_w", "class_b", "class_w", "hidden_b", "hidden_w"],
        )

    def test_data_is_deterministic(self):
        a = port_mask_rcnn.make_data(50, seed=3)
        b = port_mask_rcnn.make_data(50, seed=3)
        for key in a:
            self.assertAllEqual(a[key], b[key])
        self.assertEqual(a["features"].shape, (50, port_mask_rcnn.FEATURES))


if __name__ == "__main__":
    tf.test.main()
