"""Summaries once per step without tower prefixes, read back from the event files."""

import contextlib
import glob
import io
import os
from unittest import mock

import numpy as np
import tensorflow as tf
from absl import logging

import towers
from tests import test_util
from towers.progress import _step_timer


def read_events(logdir):
    """{tag: [(step, value)]} from every event file under `logdir`."""
    found = {}
    for path in sorted(glob.glob(os.path.join(logdir, "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                number = float(tf.make_ndarray(value.tensor))
                found.setdefault(value.tag, []).append((event.step, number))
                plugin = value.metadata.plugin_data.plugin_name
                if plugin:
                    found.setdefault("plugins", set()).add(plugin)
    return found


class SummaryScalarTest(tf.test.TestCase):
    def test_towers_write_once_per_step_without_prefixes(self):
        logdir = self.get_temp_dir() + "/logs"
        devices = test_util.devices(3)
        model, optimizer = test_util.Model(), towers.SGD(0.1)
        writer = tf.summary.create_file_writer(logdir)

        def loss_fn(batch):
            loss, outputs = test_util.loss_fn(model)(batch)
            towers.summary_scalar("tower/loss", loss)  # in a tower: the first tower only
            return loss, outputs

        @tf.function
        def step(batch, i):
            with tf.name_scope("train"):
                loss, _ = towers.train_step(loss_fn, model, optimizer, batch, devices)
                towers.summary_scalar("train/loss", loss, step=i)
            return loss

        losses, step_count = [], tf.Variable(0, dtype=tf.int64)
        with writer.as_default(step=step_count):
            for i in range(3):
                step_count.assign(i)
                losses.append(float(step(test_util.batch(10, seed=i), tf.constant(i, tf.int64))))
        writer.flush()
        found = read_events(logdir)
        self.assertEqual(sorted(found), ["plugins", "tower/loss", "train/loss"])
        self.assertEqual(found["plugins"], {"scalars"})
        self.assertEqual([s for s, _ in found["train/loss"]], [0, 1, 2])
        self.assertAllClose([v for _, v in found["train/loss"]], losses)
        self.assertEqual([s for s, _ in found["tower/loss"]], [0, 1, 2])  # once, not 3 times

    def test_without_a_writer_nothing_is_written_and_bad_input_is_refused(self):
        self.assertFalse(bool(towers.summary_scalar("x", 1.0, step=0)))
        with self.assertRaisesRegex(TypeError, "`name` must be a non-empty string"):
            towers.summary_scalar("", 1.0, step=0)
        with self.assertRaisesRegex(ValueError, "`value` must be a scalar; got shape"):
            towers.summary_scalar("x", np.ones(3), step=0)


class StepTimerTest(tf.test.TestCase):
    def test_reports_speed_and_time_left_from_the_second_step(self):
        ticks = iter([10.0, 10.5, 11.0, 11.5, 12.0])  # the first call starts the clock
        lines = []
        timer = towers.StepTimer(
            10, examples_per_step=64, every=2, clock=lambda: next(ticks), log=lines.append
        )
        reported = [timer.step_end(step) for step in range(1, 6)]
        self.assertEqual(reported, [False, True, False, True, False])
        self.assertEqual(timer.ms_per_step, 500.0)
        self.assertEqual(timer.examples_per_second, 128.0)
        self.assertEqual(timer.seconds_left, 3.0)  # 6 steps left at 0.5 s
        self.assertEqual(lines[-1], "step 4/10: 500.00 ms/step, 128 examples/s, 0:00:03 left")

    def test_reports_reach_stderr_outside_absl_app_and_the_log_under_it(self):
        """Before: outside absl.app, absl dropped the INFO lines: nothing was shown."""
        for parsed in (False, True):
            ticks = iter([0.0, 0.25])
            timer = towers.StepTimer(every=1, clock=lambda: next(ticks))  # noqa: B023
            stderr = io.StringIO()
            with mock.patch.object(_step_timer, "_under_absl_app", return_value=parsed):
                with contextlib.redirect_stderr(stderr), self.assertLogs(level="INFO") as logs:
                    timer.step_end(1)
                    timer.step_end(2)
                    logging.warning("end")  # (assertLogs needs one record)
            line = "step 2: 250.00 ms/step"
            if parsed:
                self.assertIn(line, logs.output[0])
                self.assertNotIn(line, stderr.getvalue())
            else:
                self.assertEqual(stderr.getvalue(), line + "\n")
        with self.assertRaisesRegex(TypeError, "`log` must be callable"):
            towers.StepTimer(log="stderr")

    def test_a_restart_from_an_earlier_step_starts_the_clock_again(self):
        ticks = iter([0.0, 1.0, 2.0, 100.0, 101.0])
        timer = towers.StepTimer(every=1, clock=lambda: next(ticks))
        for step in (1, 2, 3):
            timer.step_end(step)
        self.assertFalse(timer.step_end(1))  # resumed from step 1, long after
        self.assertTrue(timer.step_end(2))
        self.assertEqual(timer.ms_per_step, 1000.0)

    def test_writes_perf_summaries_with_a_writer(self):
        logdir = self.get_temp_dir() + "/perf"
        ticks = iter([0.0, 0.01, 0.02])
        timer = towers.StepTimer(examples_per_step=100, every=1, clock=lambda: next(ticks))
        writer = tf.summary.create_file_writer(logdir)
        with writer.as_default():
            for step in (1, 2, 3):
                timer.step_end(step)
        writer.flush()
        found = read_events(logdir)
        self.assertAllClose([v for _, v in found["perf/ms_per_step"]], [10.0, 10.0])
        self.assertAllClose([v for _, v in found["perf/examples_per_second"]], [1e4, 1e4])

    def test_bad_arguments(self):
        with self.assertRaisesRegex(ValueError, "`every` must be an int >= 1 or None; got 0"):
            towers.StepTimer(every=0)
        with self.assertRaisesRegex(TypeError, "`total_steps` must be an int >= 1 or None"):
            towers.StepTimer(total_steps=2.5)


if __name__ == "__main__":
    tf.test.main()
