import json
import os

import numpy as np
import tensorflow as tf
from absl.testing import parameterized

import towers
from tests import test_util


def _run(directory, k, start, stop, momentum, manager_kwargs=None):
    """Trains a fresh model from the latest checkpoint in `directory` up to step `stop`."""
    model, optimizer = test_util.Model(), towers.SGD(0.1, momentum=momentum)
    model(test_util.batch(1)[0])  # variables exist before a restore
    manager = towers.CheckpointManager(directory, model, optimizer, **(manager_kwargs or {}))
    step = manager.restore_latest()
    if step != start:
        raise AssertionError(f"restored step {step}, expected {start}")
    devices = test_util.devices(k)
    train = tf.function(
        lambda b: towers.train_step(test_util.loss_fn(model), model, optimizer, b, devices)[0]
    )
    while step < stop:
        loss = train(test_util.batch(11, seed=step))
        step += 1
        manager.step_end(step, value=float(loss))
    return model, manager


def _uninterrupted(steps, momentum):
    """The same training written by hand on one device, without stopping."""
    model = test_util.Model()
    step = test_util.reference_step(model, test_util.loss_fn(model), 0.1, momentum)
    for i in range(steps):
        step(test_util.batch(11, seed=i))
    return model


class ResumeTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.parameters((0.0, ".npz"), (0.9, ".npz"), (0.9, ".h5"), (0.9, ""))
    def test_resume_with_another_tower_count_matches_an_uninterrupted_run(self, momentum, suffix):
        base = self.get_temp_dir()
        kwargs = {"every_n_steps": 5, "suffix": suffix}
        whole = _uninterrupted(20, momentum)
        resumed_dir = os.path.join(base, f"resumed{suffix}")
        _run(resumed_dir, 2, 0, 10, momentum, kwargs)
        resumed, manager = _run(resumed_dir, 3, 10, 20, momentum, kwargs)
        for got, want in zip(resumed.variables, whole.variables):
            test_util.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        self.assertEqual(manager.steps, [10, 15, 20])

    def test_fresh_directory_starts_at_zero(self):
        manager = towers.CheckpointManager(self.get_temp_dir(), test_util.Model())
        self.assertEqual(manager.restore_latest(), 0)
        self.assertIsNone(manager.latest_weights)
        self.assertIsNone(manager.best_weights)

    def test_optimizer_state_must_match(self):
        directory = self.get_temp_dir()
        _run(directory, 2, 0, 5, 0.9, {"every_n_steps": 5})
        model = test_util.Model()
        model(test_util.batch(1)[0])
        manager = towers.CheckpointManager(directory, model, towers.SGD(0.1))  # no momentum
        with self.assertRaisesRegex(ValueError, "unexpected in the file: slots/b1"):
            manager.restore_latest()


class KeepTest(tf.test.TestCase, parameterized.TestCase):
    def _manager(self, **kwargs):
        model = test_util.Model()
        model(test_util.batch(1)[0])
        return model, towers.CheckpointManager(self.get_temp_dir(), model, **kwargs)

    def test_every_n_steps_and_keep_last(self):
        _, manager = self._manager(every_n_steps=3, keep_last=2)
        saved = [step for step in range(1, 13) if manager.step_end(step)]
        self.assertEqual(saved, [3, 6, 9, 12])
        self.assertEqual(manager.steps, [9, 12])
        self.assertEqual(
            sorted(os.listdir(self.get_temp_dir())),
            [
                "checkpoints.json",
                "ckpt-00000009.state.npz",
                "ckpt-00000009.weights.npz",
                "ckpt-00000012.state.npz",
                "ckpt-00000012.weights.npz",
            ],
        )
        self.assertTrue(manager.latest_weights.endswith("ckpt-00000012.weights.npz"))

    @parameterized.parameters(
        ("min", [3.0, 2.0, 2.5, 1.0, 1.5], 4, 1.0), ("max", [3.0, 2.0, 4.5, 1.0, 4.5], 3, 4.5)
    )
    def test_keep_best(self, monitor, values, best_step, best_value):
        model, manager = self._manager(every_n_steps=1, keep_last=1, monitor=monitor)
        best_w1 = None
        for step, value in enumerate(values, 1):
            model.w1.assign_add(tf.ones_like(model.w1))
            manager.step_end(step, value=value)
            if step == best_step:
                best_w1 = model.w1.numpy()
        self.assertEqual(manager.best_value, best_value)
        self.assertTrue(manager.best_weights.endswith(f"best-{best_step:08d}.weights.npz"))
        self.assertAllEqual(towers.read_weights(manager.best_weights)["w1"], best_w1)
        bests = [n for n in os.listdir(self.get_temp_dir()) if n.startswith("best-")]
        self.assertLen(bests, 1)
        again = towers.CheckpointManager(self.get_temp_dir(), model, monitor=monitor)
        self.assertEqual(again.best_value, best_value)  # a resumed run keeps comparing

    def test_value_required_when_monitoring(self):
        _, manager = self._manager(monitor="min")
        with self.assertRaisesRegex(ValueError, "finite number when monitor='min'; got None"):
            manager.save(1)
        with self.assertRaisesRegex(ValueError, "got nan"):
            manager.save(1, value=float("nan"))

    def test_bad_arguments(self):
        for kwargs, message in [
            ({"every_n_steps": 0}, "every_n_steps"),
            ({"keep_last": 0}, "keep_last"),
            ({"monitor": "lowest"}, "'min', 'max' or None; got 'lowest'"),
            ({"suffix": ".pt"}, "got '.pt'"),
        ]:
            with self.assertRaisesRegex(ValueError, message):
                towers.CheckpointManager(self.get_temp_dir(), [], **kwargs)

    def test_corrupt_index(self):
        with open(os.path.join(self.get_temp_dir(), "checkpoints.json"), "w") as f:
            f.write("{not json")
        with self.assertRaisesRegex(ValueError, "checkpoint index .* is corrupt"):
            towers.CheckpointManager(self.get_temp_dir(), [])
        with open(os.path.join(self.get_temp_dir(), "checkpoints.json"), "w") as f:
            f.write('{"checkpoints": []}')
        with self.assertRaisesRegex(ValueError, r"is corrupt \(keys missing\)"):
            towers.CheckpointManager(self.get_temp_dir(), [])

    def test_index_only_names_complete_checkpoints(self):
        _, manager = self._manager()
        killed = os.path.join(self.get_temp_dir(), "ckpt-00000009.weights.npz")
        with open(killed, "wb") as f:
            f.write(b"a save killed before its index was written")
        mine = os.path.join(self.get_temp_dir(), "notes.txt")
        open(mine, "w").close()
        manager.save(7)
        self.assertFalse(os.path.exists(killed))
        self.assertTrue(os.path.exists(mine))
        with open(os.path.join(self.get_temp_dir(), "checkpoints.json")) as f:
            index = json.load(f)
        self.assertEqual(
            index["checkpoints"],
            [
                {
                    "step": 7,
                    "weights": "ckpt-00000007.weights.npz",
                    "state": "ckpt-00000007.state.npz",
                }
            ],
        )
        state = towers.read_weights(os.path.join(self.get_temp_dir(), "ckpt-00000007.state.npz"))
        self.assertEqual(int(state["__step__"]), 7)
        self.assertEqual(state["__step__"].dtype, np.int64)


if __name__ == "__main__":
    tf.test.main()
