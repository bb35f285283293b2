"""The models suite (`--suite=models`): real models' rows, their throughput and targets."""

import numpy as np
import tensorflow as tf

from tests import test_util
from towers.bench import _keras_gpt, _keras_resnet, _model_steps, _model_suite, _real_models


class ModelsSuiteTest(tf.test.TestCase):
    def test_rows_train_the_same_model(self):
        """From the same weights on the same batch: one device and towers reach one loss."""
        rows = _model_suite.suite_rows(
            "gpt_tiny", test_util.devices(2), None, global_batch=4, steps=1, warmup=0,
            compute_dtype="float32", compiled=(False,),
            configs=r"^(one device|towers replicated \(tensor\))$",
        )  # fmt: skip
        self.assertEqual([r["config"] for r in rows], ["one device", "towers replicated (tensor)"])
        losses = [r["loss"] for r in rows]
        test_util.assert_allclose(losses, [losses[0]] * len(losses), rtol=1e-5)
        for row in rows:
            self.assertAllClose(row["per_second"] * row["step_ms"] / 1e3, 4 * 32)  # tokens
            self.assertLen(row["steps_ms"], 1)
            self.assertAllClose(row["steps_ms"][0], row["step_ms"], atol=1e-3)  # (one step)
        labels = _model_steps.model_rows(lambda: None, None, test_util.devices(2), None, None,
                                         jit_compile=True)  # fmt: skip
        for label in (
            "towers ps xla",
            "towers replicated xla, no guard",
            "towers replicated xla, skip",
            "towers replicated xla, update uncompiled",
            "towers replicated xla, sharded state",
            "towers replicated xla, one bucket",
            "hand-written towers xla, update compiled",
        ):
            self.assertIn(label, labels)

    def test_flops(self):
        gpt = _real_models.REAL_MODELS["gpt_tiny"].build()
        n = sum(int(np.prod(v.shape)) for v in gpt.trainable_weights) - (512 + 32) * 64
        self.assertEqual(_keras_gpt.gpt_flops_per_token(gpt), 6 * n + 12 * 2 * 64 * 32)
        resnet = _real_models.REAL_MODELS["resnet_small"].build()
        macs = _keras_resnet.matmul_macs(resnet)
        stem = 16 * 16 * 16 * 7 * 7 * 3  # 32x32 images, stride 2: 16x16 outputs, 16 channels
        self.assertGreater(macs, stem)
        self.assertEqual(_keras_resnet.conv_net_flops_per_example(resnet), 6 * macs)
        per_second, mfu = _model_suite.throughput(1e9, 100, 50.0, num_devices=2, peak_tflops=1.0)
        self.assertAllClose((per_second, mfu), (2000.0, 1.0))

    def test_targets_compare_towers_row_with_its_peer_at_its_device_count(self):
        times = {
            "towers replicated xla": 10.0,
            "towers ps xla": 9.0,  # (not the headline: Replicated's row is)
            "mirrored xla": 10.4,
            "one device xla": 9.5,
            "towers replicated xla, no guard": 9.9,
        }
        rows = [
            dict(model="m", dtype="bfloat16", tf32=True, towers=k, config=label, step_ms=ms)
            for k in (1, 2)
            for label, ms in times.items()
        ]
        lines = _model_suite.targets_table(rows).splitlines()[1:]
        at_one = [line for line in lines if " 1 " in line]
        at_two = [line for line in lines if " 2 " in line]
        self.assertLen(at_one, 3)  # vs one device (1.03), vs mirrored (no bound), the guard
        self.assertIn("1.05", at_one[0])  # 10.0 / 9.5 > 1.03
        self.assertTrue(at_one[0].endswith("NOT met"))
        self.assertLen(at_two, 2)  # vs mirrored (0.95), the guard (1.02)
        self.assertIn("0.96", at_two[0])  # 10.0 / 10.4 > 0.95
        self.assertTrue(at_two[0].endswith("NOT met"))
        self.assertIn("1.01", at_two[1])  # 10.0 / 9.9 <= 1.02
        self.assertTrue(at_two[1].endswith("met") and not at_two[1].endswith("NOT met"))


if __name__ == "__main__":
    tf.test.main()
