import tensorflow as tf

import towers
from tests import test_util
from towers import ops


class TowerContextTest(tf.test.TestCase):
    def test_outside_any_tower(self):
        self.assertIsNone(towers.current_tower())

    def test_replicate_enters_one_context_per_tower(self):
        seen = []

        def fn(shard):
            seen.append(towers.current_tower())
            return shard

        devices = test_util.devices(3)
        towers.replicate(fn, ops.split_batch(tf.zeros([3]), 3), devices)
        self.assertEqual([t.index for t in seen], [0, 1, 2])
        self.assertEqual([t.device for t in seen], devices)
        self.assertEqual({t.num_towers for t in seen}, {3})
        self.assertEqual([t.is_chief for t in seen], [True, False, False])
        self.assertEqual([t.name_scope for t in seen], ["tower_0/", "tower_1/", "tower_2/"])
        self.assertIsNone(towers.current_tower())

    def test_nesting_is_refused(self):
        with towers.TowerContext(0, "/device:CPU:0", 2):
            with self.assertRaisesRegex(RuntimeError, "Towers do not nest: tower 1 was entered"):
                with towers.TowerContext(1, "/device:CPU:1", 2):
                    pass
            with self.assertRaisesRegex(RuntimeError, "called inside a tower"):
                towers.replicate(lambda s: s, [tf.zeros([1])], ["/cpu:0"])
        self.assertIsNone(towers.current_tower())

    def test_context_is_left_on_error(self):
        def fn(shard):
            raise KeyError("boom")

        with self.assertRaises(KeyError):
            towers.replicate(fn, [tf.zeros([1])], ["/cpu:0"])
        self.assertIsNone(towers.current_tower())

    def test_index_out_of_range(self):
        with self.assertRaisesRegex(ValueError, "got index=2, num_towers=2"):
            towers.TowerContext(2, "/device:CPU:0", 2)


if __name__ == "__main__":
    tf.test.main()
