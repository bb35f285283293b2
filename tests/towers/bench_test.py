import tensorflow as tf

from tests import test_util
from towers import _bench_report as bench


class WeightsBenchTest(tf.test.TestCase):
    def test_table_for_a_tiny_configuration(self):
        rows = bench.weights_table(1, 2, 1, self.get_temp_dir())
        self.assertEqual([r[0] for r in rows], ["npz", "h5", "checkpoint"])
        for _, disk_mb, save_s, restore_s, *_ in rows:
            self.assertAllClose(disk_mb, 1.0, atol=0.05)
            self.assertGreater(save_s, 0)
            self.assertGreater(restore_s, 0)
        table = bench.format_table(["format", "disk MB", "save s", "restore s", "a", "b"], rows)
        self.assertLen(table.splitlines(), 4)
        self.assertIn("checkpoint", table.splitlines()[3])


class StepBenchTest(tf.test.TestCase):
    def test_table_for_a_tiny_configuration(self):
        """The real command, in its own processes, for one model on 2 devices and 2 steps."""
        out = test_util.run_python(
            "import sys; from absl import app; from towers import bench\n"
            "sys.argv = ['bench', '--models=many_small', '--towers=2', '--steps=2', "
            "'--warmup=0', '--algorithms=ring,collective', '--batch_size=64']\n"
            "app.run(bench.main)\n",
            timeout=300,
        )
        lines = [line.split() for line in out.splitlines()]
        self.assertEqual(lines[0][:4], ["model", "K", "configuration", "step"])
        rows = {" ".join(line[2:-6]): line for line in lines[1:] if line[0] == "many_small"}
        self.assertEqual(
            set(rows),
            {
                "one device",
                "hand-written towers",
                "mirrored strategy",
                "towers ps",
                "towers replicated ring",
                "towers replicated collective",
            },
        )
        for line in rows.values():
            self.assertEqual(line[1], "2")
            step_ms, examples, trace = (float(x) for x in line[-6:-3])
            self.assertGreater(step_ms, 0)
            self.assertAlmostEqual(examples, 64 / step_ms * 1e3, delta=examples * 0.01 + 1)
            self.assertGreater(trace, 0)
        self.assertEqual(rows["one device"][-3], "1.00")
        self.assertEqual(rows["mirrored strategy"][-2], "1.00")
        self.assertEqual(rows["towers replicated ring"][-1], "1")  # 101 variables, one bucket
        self.assertEqual(rows["towers ps"][-1], "-")


if __name__ == "__main__":
    tf.test.main()
