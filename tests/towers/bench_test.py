import tensorflow as tf

from towers import bench


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


if __name__ == "__main__":
    tf.test.main()
