import json
import os
import random
import signal
import sys
import time
from unittest import mock

import numpy as np
import tensorflow as tf
from absl.testing import parameterized

import towers
from tests import forked, test_util
from towers.checkpoints import _manager as _manager_module


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


class V1SessionTest(tf.test.TestCase):
    def test_a_v1_graph_saves_and_restores_through_its_session(self):
        directory = os.path.join(self.get_temp_dir(), "v1")

        def graph_and_step():
            batch = test_util.batch(9)
            model, optimizer = test_util.Model(), towers.SGD(0.1, momentum=0.9)
            global_step = tf.compat.v1.train.get_or_create_global_step()
            loss, _ = towers.train_step(
                test_util.loss_fn(model), model, optimizer, batch, test_util.devices(2)
            )
            with tf.control_dependencies([loss]):
                train_op = global_step.assign_add(1)
            return model, optimizer, global_step, train_op

        with tf.Graph().as_default():
            model, optimizer, global_step, train_op = graph_and_step()
            with self.assertRaisesRegex(ValueError, r"pass CheckpointManager\(..., session=sess\)"):
                towers.CheckpointManager(directory, model, optimizer)
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                extra = {"global_step": {"global_step": global_step}}
                with towers.CheckpointManager(
                    directory, model, optimizer, extra=extra, session=sess
                ) as manager:
                    for _ in range(2):
                        step = int(sess.run(train_op))
                    manager.save(step)
                    named = towers.named_variables(model)
                    saved = dict(zip(named, sess.run(list(named.values()))))
        with tf.Graph().as_default():
            model, optimizer, global_step, train_op = graph_and_step()
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                extra = {"global_step": {"global_step": global_step}}
                with towers.CheckpointManager(
                    directory, model, optimizer, extra=extra, session=sess
                ) as manager:
                    self.assertEqual(manager.restore_latest(), 2)
                self.assertEqual(int(sess.run(global_step)), 2)
                named = towers.named_variables(model)
                for name, value in zip(named, sess.run(list(named.values()))):
                    self.assertAllEqual(value, saved[name])


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
                "checkpoints.lock",
                "ckpt-00000009.json",
                "ckpt-00000009.state.npz",
                "ckpt-00000009.weights.npz",
                "ckpt-00000012.json",
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
        self.assertCountEqual(
            bests, [f"best-{best_step:08d}.weights.npz", f"best-{best_step:08d}.json"]
        )
        manager.close()
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

    def test_a_lost_or_corrupt_index_is_rebuilt_from_the_checkpoints(self):
        directory = self.get_temp_dir()
        model, manager = self._manager(every_n_steps=1, keep_last=2, monitor="min")
        for step, value in enumerate([3.0, 1.0, 2.0, 2.5], 1):
            model.w1.assign_add(tf.ones_like(model.w1))
            manager.step_end(step, value=value)
        files = sorted(os.listdir(directory))
        manager.close()
        index = os.path.join(directory, "checkpoints.json")
        for damage in ("delete", "{not json", '{"checkpoints": []}', "[]"):
            if damage == "delete":
                os.remove(index)
            else:
                with open(index, "w") as f:
                    f.write(damage)
            manager = towers.CheckpointManager(directory, model, monitor="min", keep_last=2)
            self.assertEqual(manager.steps, [3, 4])
            self.assertEqual(manager.best_value, 1.0)
            self.assertEqual(
                towers.read_weights(manager.best_weights)["w1"][0, 0], model.w1.numpy()[0, 0] - 2
            )
            self.assertEqual(manager.restore_latest(), 4)
            manager.close()
        self.assertEqual(sorted(os.listdir(directory)), files)  # nothing was deleted
        manager = towers.CheckpointManager(directory, model, monitor="min", keep_last=2)
        manager.save(5, value=4.0)
        self.assertEqual(manager.steps, [4, 5])
        self.assertEqual(manager.best_value, 1.0)  # the best file survives the next save
        self.assertTrue(os.path.exists(manager.best_weights))

    def test_checkpoints_whose_records_are_lost_are_used_but_never_deleted(self):
        directory = self.get_temp_dir()
        model, manager = self._manager(every_n_steps=1, keep_last=2, monitor="min")
        for step, value in enumerate([3.0, 1.0, 2.0], 1):
            model.w1.assign(tf.fill(model.w1.shape, float(step)))
            manager.step_end(step, value=value)
        manager.close()
        for name in os.listdir(directory):
            if name.endswith(".json"):  # the index and every record
                os.remove(os.path.join(directory, name))
        files = set(os.listdir(directory))
        with towers.CheckpointManager(directory, model, monitor="min", keep_last=2) as manager:
            self.assertEqual(manager.steps, [2, 3])  # weights with state: whole checkpoints
            # The best (step 2, value 1.0) lost its value with its record: it stays the best,
            # since no later value is known to beat it.
            best = os.path.join(directory, "best-00000002.weights.npz")
            self.assertEqual((manager.best_weights, manager.best_value), (best, None))
            self.assertEqual(manager.restore_latest(), 3)
            self.assertAllEqual(model.w1, tf.fill(model.w1.shape, 3.0))
            manager.save(5, value=2.5)
            manager.save(6, value=0.5)
            self.assertEqual(manager.steps, [5, 6])
            self.assertEqual(manager.best_weights, best)
        self.assertLessEqual(
            files, set(os.listdir(directory))
        )  # none deleted: not provably its own

    def test_a_foreign_file_with_a_record_name_is_not_a_checkpoint(self):
        directory = self.get_temp_dir()
        with open(os.path.join(directory, "ckpt-00000003.json"), "w") as f:
            f.write("my notes, not a record")
        _, manager = self._manager()
        self.assertEqual(manager.steps, [])
        self.assertEqual(manager.restore_latest(), 0)

    def test_only_recorded_saves_are_its_own_and_killed_ones_are_cleaned_up(self):
        directory = self.get_temp_dir()
        lookalike = os.path.join(directory, "ckpt-00000009.weights.npz")
        with open(lookalike, "wb") as f:
            f.write(b"a user's file that happens to have a manager's name")
        # A save killed after its pending record and weights, before its state and commit.
        killed = {
            "written_by": "towers.CheckpointManager",
            "kind": "ckpt",
            "step": 3,
            "serial": 0,
            "weights": "ckpt-00000003.weights.npz",
            "state": "ckpt-00000003.state.npz",
            "complete": False,
        }
        with open(os.path.join(directory, "ckpt-00000003.json"), "w") as f:
            json.dump(killed, f)
        towers.save_weights({"w": tf.Variable(1.0)}, os.path.join(directory, killed["weights"]))
        mine = os.path.join(directory, "notes.txt")
        open(mine, "w").close()
        _, manager = self._manager()
        self.assertEqual(manager.steps, [])
        for name in ("ckpt-00000003.json", "ckpt-00000003.weights.npz"):
            self.assertNotIn(name, os.listdir(directory))
        manager.save(7)
        self.assertTrue(os.path.exists(lookalike))  # never its own: no record names it
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


_RESAVER = """
import os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import numpy as np, tensorflow as tf, towers
model = {"w": tf.Variable(np.zeros([128, 128], np.float32))}
state = {"m": tf.Variable(np.zeros([128, 128], np.float32))}
manager = towers.CheckpointManager(sys.argv[1], model, state, keep_last=2, suffix=sys.argv[2])
if not manager.steps:
    manager.save(4)
i = 0
while True:
    i += 1
    model["w"].assign(tf.fill([128, 128], float(i)))
    state["m"].assign(tf.fill([128, 128], float(i)))
    manager.save(5)  # the same step, again and again
    if i == 1:
        print("ready", flush=True)
"""

_HOLDER = """
import sys, time
import towers
manager = towers.CheckpointManager(sys.argv[1], [])
print("locked", flush=True)
time.sleep(60)
"""


def _spawn(code, *args):
    child = forked.Popen(
        [sys.executable, "-c", code, *args],
        env=test_util.child_env(),
        stdout=forked.PIPE,
        stderr=forked.DEVNULL,
        text=True,
    )
    return child, child.stdout.readline().strip()


class FaultTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.parameters(".npz", ".ckpt")
    def test_a_resave_killed_at_any_moment_leaves_one_whole_save(self, suffix):
        directory = os.path.join(self.get_temp_dir(), suffix)
        rng = random.Random(1)
        interrupted = 0
        for _ in range(10):  # until a kill landed mid-save; at most 10
            if interrupted >= 1:
                break
            child, line = _spawn(_RESAVER, directory, suffix)
            self.assertEqual(line, "ready")
            time.sleep(rng.uniform(0.05, 0.5))
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=30)
            step5 = [n for n in os.listdir(directory) if n.startswith("ckpt-00000005")]
            interrupted += len(step5) > 3  # more than one save's weights, state and record
            model = {"w": tf.Variable(np.zeros([128, 128], np.float32))}
            state = {"m": tf.Variable(np.zeros([128, 128], np.float32))}
            with towers.CheckpointManager(directory, model, state, suffix=suffix) as manager:
                self.assertEqual(manager.steps, [4, 5])
                self.assertEqual(manager.restore_latest(), 5)
            values = {float(v) for v in np.unique(model["w"])} | set(np.unique(state["m"]))
            self.assertLen(values, 1, f"weights and state of different saves: {values}")
        self.assertGreater(interrupted, 0)  # the kills did land mid-save: not vacuous

    def test_one_writer_per_directory(self):
        directory = self.get_temp_dir()
        first = towers.CheckpointManager(directory, [])
        with self.assertRaisesRegex(
            RuntimeError,
            rf"{directory!r} is being written by another CheckpointManager \(pid "
            rf"{os.getpid()} on .*\); one writer per directory",
        ):
            towers.CheckpointManager(directory, [])
        first.close()
        with self.assertRaisesRegex(RuntimeError, "is closed"):
            first.save(1)
        towers.CheckpointManager(directory, []).close()
        child, line = _spawn(_HOLDER, directory)
        try:
            self.assertEqual(line, "locked")
            with self.assertRaisesRegex(RuntimeError, rf"\(pid {child.pid} on "):
                towers.CheckpointManager(directory, [])
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=30)
        towers.CheckpointManager(directory, []).close()  # a killed holder leaves no lock

    def test_restore_is_all_or_nothing(self):
        directory = self.get_temp_dir()
        _run(directory, 2, 0, 5, 0.9, {"every_n_steps": 5})
        model = test_util.Model()
        model(test_util.batch(1)[0])
        before = [v.numpy() for v in model.variables]
        with towers.CheckpointManager(directory, model, towers.SGD(0.1)) as manager:  # no momentum
            with self.assertRaisesRegex(
                ValueError, r"(?s)nothing was restored.*unexpected in the file: slots/b1"
            ):
                manager.restore_latest()
            for got, want in zip(model.variables, before):
                self.assertAllEqual(got, want)
            self.assertEqual(manager.restore_latest(strict=False), 5)
        self.assertNotAllClose(model.w1, before[3])

    def test_arguments_are_checked_where_given(self):
        model = test_util.Model()
        model(test_util.batch(1)[0])
        with self.assertRaisesRegex(TypeError, "optimizer's state as variables.*got object"):
            towers.CheckpointManager(self.get_temp_dir(), model, object())
        with towers.CheckpointManager(self.get_temp_dir(), model) as manager:
            for step, error in [
                (1.5, TypeError),
                ("3", TypeError),
                (True, TypeError),
                (-5, ValueError),
                (2**64, ValueError),
            ]:
                with self.assertRaisesRegex(
                    error, r"`step` must be an int in \[0, 9223372036854775807\]"
                ):
                    manager.save(step)
                with self.assertRaisesRegex(
                    error, r"`step` must be an int in \[0, 9223372036854775807\]"
                ):
                    manager.step_end(step)
            self.assertEqual(manager.steps, [])
            manager.save(np.int64(100))  # numpy ints are steps too
            self.assertEqual(manager.steps, [100])
        a_file = os.path.join(self.get_temp_dir(), "checkpoints.json")
        with self.assertRaisesRegex(ValueError, "`directory` .* is a file"):
            towers.CheckpointManager(a_file, model)
        with self.assertRaisesRegex(TypeError, "`directory` must be a str or os.PathLike"):
            towers.CheckpointManager(3, model)
        with self.assertRaisesRegex(ValueError, "`directory` must name a directory; got ''"):
            towers.CheckpointManager("", model)

    def test_a_step_older_than_the_newest_is_refused_not_deleted(self):
        with towers.CheckpointManager(
            self.get_temp_dir(), {"w": tf.Variable(1.0)}, keep_last=2
        ) as m:
            m.save(10)
            m.save(20)
            with self.assertRaisesRegex(
                ValueError, "`step` 5 is below the newest checkpoint .*step 20"
            ):
                m.save(5)
            self.assertEqual(m.steps, [10, 20])

    def test_a_failed_save_does_not_cost_a_complete_checkpoint(self):
        model = {"w": tf.Variable(1.0)}
        real = _manager_module.save_weights

        def failing_best(target, path, **kwargs):
            if os.path.basename(path).startswith("best-") and "00000003" in path:
                raise OSError(28, "No space left on device")
            real(target, path, **kwargs)

        with towers.CheckpointManager(self.get_temp_dir(), model, keep_last=3, monitor="min") as m:
            m.save(1, value=5.0)
            m.save(2, value=6.0)
            with mock.patch.object(_manager_module, "save_weights", failing_best):
                with self.assertRaisesRegex(OSError, "No space"):
                    m.save(3, value=1.0)  # its checkpoint committed, its best failed
            m.save(4, value=7.0)
            self.assertEqual(m.steps, [2, 3, 4])
            self.assertEqual(m.best_value, 5.0)

    def test_the_best_survives_a_lost_record_and_a_changed_monitor(self):
        directory = self.get_temp_dir()
        model = {"w": tf.Variable(1.0)}
        with towers.CheckpointManager(directory, model, monitor="min") as m:
            m.save(1, value=0.5)
            m.save(2, value=0.1)
        os.remove(os.path.join(directory, "best-00000002.json"))  # the index still has it
        with towers.CheckpointManager(directory, model, monitor="min") as m:
            self.assertEqual(m.best_value, 0.1)
            m.save(3, value=0.9)
            self.assertTrue(m.best_weights.endswith("best-00000002.weights.npz"))
        with towers.CheckpointManager(directory, model, monitor="max") as m:
            self.assertIsNone(m.best_value)  # "max" does not compare with a "min" best
            m.save(4, value=0.9)
            self.assertEqual(m.best_value, 0.9)
        self.assertIn("best-00000002.weights.npz", os.listdir(directory))  # not deleted

    def test_lookalike_files_and_folders_are_never_touched(self):
        directory = self.get_temp_dir()
        folder = os.path.join(directory, "ckpt-00000009.weights", "mydata")
        os.makedirs(folder)
        open(os.path.join(folder, "notes.txt"), "w").close()
        np.savez(os.path.join(directory, "best-00000001.weights.npz"), a=np.ones(2))
        with open(os.path.join(directory, "best-00000001.json"), "w") as f:
            f.write('{"kind": "best", "step": 1}')  # not written by towers
        stale = os.path.join(directory, ".ckpt-00000001.weights.npz.999999999.abcdefgh.tmp")
        live = os.path.join(directory, f".ckpt-00000001.weights.npz.{os.getpid()}.abcdefgh.tmp")
        for path in (stale, live):
            open(path, "w").close()
        lookalike_best = os.path.join(directory, "best-00000001.weights.npz")
        with towers.CheckpointManager(directory, {"w": tf.Variable(1.0)}, monitor="min") as m:
            self.assertEqual(m.best_weights, lookalike_best)  # used read-only: its value unknown
            for step in (1, 2, 3, 4):
                m.save(step, value=float(step))
            self.assertEqual(m.best_weights, lookalike_best)  # and never replaced
        self.assertTrue(os.path.exists(os.path.join(folder, "notes.txt")))
        self.assertTrue(os.path.exists(os.path.join(directory, "best-00000001.weights.npz")))
        self.assertFalse(os.path.exists(stale))  # a killed save's temporary: its process is gone
        self.assertTrue(os.path.exists(live))  # this process's: maybe another thread's

    def test_threads_share_one_manager(self):
        import threading

        model = {"w": tf.Variable(1.0)}
        errors = []
        with towers.CheckpointManager(self.get_temp_dir(), model, keep_last=50) as m:

            def saves(start):
                try:
                    for _ in range(start, start + 10):
                        m.save(100)  # the same step from both threads
                except Exception as error:  # noqa: BLE001
                    errors.append(error)

            threads = [threading.Thread(target=saves, args=(i,)) for i in (0, 10)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            self.assertEqual(errors, [])
            self.assertEqual(m.steps, [100])
            m.close()
            with self.assertRaisesRegex(RuntimeError, "is closed"):
                m.restore_latest()

    def test_a_resave_replaces_the_step_and_keeps_one_copy(self):
        model = {"w": tf.Variable(1.0)}
        with towers.CheckpointManager(self.get_temp_dir(), model) as manager:
            manager.save(3)
            model["w"].assign(2.0)
            path = manager.save(3)
            self.assertEqual(manager.steps, [3])
            self.assertEqual(float(towers.read_weights(path)["w"]), 2.0)
            self.assertEqual(
                sorted(n for n in os.listdir(self.get_temp_dir()) if n.startswith("ckpt")),
                [
                    "ckpt-00000003.1.json",
                    "ckpt-00000003.1.state.npz",
                    "ckpt-00000003.1.weights.npz",
                ],
            )
            model["w"].assign(0.0)
            self.assertEqual(manager.restore_latest(), 3)
        self.assertEqual(float(model["w"]), 2.0)

    def test_a_directory_of_the_previous_version_is_adopted(self):
        directory = self.get_temp_dir()
        model = {"w": tf.Variable(7.0)}
        towers.save_weights(model, os.path.join(directory, "ckpt-00000006.weights.npz"))
        towers.save_weights(
            {"__step__": tf.Variable(np.int64(6))},
            os.path.join(directory, "ckpt-00000006.state.npz"),
        )
        index = {
            "checkpoints": [
                {
                    "step": 6,
                    "weights": "ckpt-00000006.weights.npz",
                    "state": "ckpt-00000006.state.npz",
                }
            ],
            "best": None,
        }
        with open(os.path.join(directory, "checkpoints.json"), "w") as f:
            json.dump(index, f)
        model["w"].assign(0.0)
        with towers.CheckpointManager(directory, model) as manager:
            self.assertEqual(manager.restore_latest(), 6)
        self.assertEqual(float(model["w"]), 7.0)
        self.assertIn("ckpt-00000006.json", os.listdir(directory))


if __name__ == "__main__":
    tf.test.main()
