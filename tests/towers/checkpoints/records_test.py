"""A checkpoint directory is untrusted input: forged records and links touch nothing outside,
and losing any file of one checkpoint costs no other."""

import json
import os

import numpy as np
import tensorflow as tf

import towers
from tests import test_util  # noqa: F401  (the process set-up)


def _model(value=1.0):
    return {"w": tf.Variable(tf.fill([3], value))}


class HostileDirectoryTest(tf.test.TestCase):
    def setUp(self):
        super().setUp()
        root = self.get_temp_dir()
        self.run_dir = os.path.join(root, "run")
        self.victim = os.path.join(root, "victim.npz")  # a user's file beside the run
        np.savez(self.victim, w=np.full([3], 42.0, np.float32))

    def _write(self, name, fields):
        with open(os.path.join(self.run_dir, name), "w") as f:
            json.dump({"written_by": "towers.CheckpointManager", **fields}, f)

    def _victim_intact(self):
        self.assertTrue(os.path.exists(self.victim))
        np.testing.assert_array_equal(np.load(self.victim)["w"], [42.0, 42.0, 42.0])

    def test_a_forged_pending_record_deletes_nothing_outside(self):
        os.makedirs(self.run_dir)
        for state in (self.victim, "../victim.npz"):  # absolute, and climbing out
            self._write(
                "ckpt-00000005.json",
                dict(kind="ckpt", step=5, serial=0, weights=self.victim, state=state,
                     value=None, monitor=None, complete=False),
            )  # fmt: skip
            towers.CheckpointManager(self.run_dir, _model()).close()
            self._victim_intact()

    def test_an_index_entry_naming_a_file_outside_is_never_deleted(self):
        with towers.CheckpointManager(self.run_dir, _model(), keep_last=1) as manager:
            manager.save(1)
        index = os.path.join(self.run_dir, "checkpoints.json")
        with open(index) as f:
            entries = json.load(f)
        # Step 1's own entry, its state made to name the user's file.
        entries["checkpoints"] = [
            {"step": 1, "weights": "ckpt-00000001.weights.npz", "state": "../victim.npz"}
        ]
        os.remove(os.path.join(self.run_dir, "ckpt-00000001.json"))  # only the index says it
        with open(index, "w") as f:
            json.dump(entries, f)
        with towers.CheckpointManager(self.run_dir, _model(), keep_last=1) as manager:
            manager.save(2)
            manager.save(3)  # rotations
        self._victim_intact()

    def test_a_record_rewritten_to_load_a_file_outside_is_ignored(self):
        with towers.CheckpointManager(self.run_dir, _model(1.0)) as manager:
            manager.save(1)
            manager.save(2)
        self._write(
            "ckpt-00000002.json",
            dict(kind="ckpt", step=2, serial=0, weights="../victim.npz",
                 state="ckpt-00000002.state.npz", value=None, monitor=None, complete=True),
        )  # fmt: skip
        model = _model(0.0)
        with self.assertLogs(level="WARNING") as logs:
            manager = towers.CheckpointManager(self.run_dir, model)
        self.assertIn("ckpt-00000002.json names files that are not its own", logs.output[0])
        self.assertIn("'../victim.npz'", logs.output[0])
        with manager:
            self.assertEqual(manager.steps, [1, 2])  # step 2 is found by its files' names
            self.assertEqual(manager.restore_latest(), 2)
        self.assertAllEqual(model["w"], [1.0, 1.0, 1.0])  # its own weights, not the victim's
        self._victim_intact()

    def test_a_lock_file_made_a_link_is_refused_and_its_target_untouched(self):
        os.makedirs(self.run_dir)
        os.symlink(self.victim, os.path.join(self.run_dir, "checkpoints.lock"))
        with self.assertRaisesRegex(ValueError, "checkpoints.lock' is a symbolic link"):
            towers.CheckpointManager(self.run_dir, _model())
        self._victim_intact()

    def test_a_checkpoint_file_made_a_link_is_neither_read_nor_followed(self):
        with towers.CheckpointManager(self.run_dir, _model(1.0)) as manager:
            manager.save(1)
            manager.save(2)
        weights = os.path.join(self.run_dir, "ckpt-00000002.weights.npz")
        os.remove(weights)
        os.symlink(self.victim, weights)
        model = _model(0.0)
        with towers.CheckpointManager(self.run_dir, model) as manager:
            self.assertEqual(manager.restore_latest(), 1)  # step 2 is damaged: left alone
        self.assertAllEqual(model["w"], [1.0, 1.0, 1.0])
        self.assertTrue(os.path.islink(weights))
        self._victim_intact()


class NothingLostTest(tf.test.TestCase):
    def test_a_lost_state_file_costs_no_other_checkpoint(self):
        directory = self.get_temp_dir()
        with towers.CheckpointManager(directory, _model(1.0), keep_last=2) as manager:
            manager.save(1)
            manager.save(2)
        os.remove(os.path.join(directory, "ckpt-00000002.state.npz"))
        weights = os.path.join(directory, "ckpt-00000002.weights.npz")
        model = _model(0.0)
        with towers.CheckpointManager(directory, model, keep_last=2) as manager:
            self.assertEqual(manager.restore_latest(), 1)  # the newest whole one
            for step in (3, 4, 5):  # rotations
                manager.save(step)
        self.assertTrue(os.path.exists(weights))  # damaged: never restored, never deleted
        self.assertEqual(towers.read_weights(weights)["w"].tolist(), [1.0, 1.0, 1.0])

    def test_with_every_record_lost_the_best_is_never_replaced_by_an_unknown_value(self):
        directory = self.get_temp_dir()
        with towers.CheckpointManager(directory, _model(), monitor="min") as manager:
            for step in (100, 200, 300):
                manager.save(step, value=1.0 / step)
        for name in os.listdir(directory):
            if name.endswith(".json"):
                os.remove(os.path.join(directory, name))
        best = os.path.join(directory, "best-00000300.weights.npz")
        with towers.CheckpointManager(directory, _model(), monitor="min") as manager:
            self.assertEqual(manager.restore_latest(), 300)
            self.assertEqual(manager.best_weights, best)
            manager.save(301, value=5.0)
            self.assertEqual(manager.best_weights, best)
        self.assertTrue(os.path.exists(best))


if __name__ == "__main__":
    tf.test.main()
