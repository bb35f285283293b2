"""A step timer for training loops: ms/step, examples/s and time left, logged."""

import datetime
import sys
import time
from collections.abc import Callable
from typing import Any

import tensorflow as tf
from absl import flags, logging

from towers.ops.internal import check_int
from towers.progress._summaries import summary_scalar


class StepTimer:
    """Reports the speed of a training loop every `every` steps.

    Call `step_end(step)` after each step. The clock starts at the first call, so the first
    step (the trace of a `tf.function`) is not counted. Every `every` steps it reports (through
    `log`: absl's INFO log in a program run by `absl.app`, whose flags are parsed, else a line
    on stderr, which absl would drop below WARNING) the milliseconds per step and examples
    per second since the last report and, with `total_steps`, the time left; with a default
    summary writer, it also writes "perf/ms_per_step" and "perf/examples_per_second"
    (`towers.summary_scalar`).

    Args:
      total_steps: The step the loop ends at (for the time left), or None.
      examples_per_step: The global batch size (for examples/s), or None.
      every: Report every this many steps, >= 1.
      clock: Seconds as a float; `time.perf_counter` unless a test fakes it.
      log: Where each report line goes (e.g. `print`); None for the default above.

    Raises:
      ValueError: for a non-positive `every`, `total_steps` or `examples_per_step`.

    Example:
      >>> timer = towers.StepTimer(total_steps=1000, examples_per_step=256, every=100)
      >>> for step in range(1, 1001):
      ...     train(next(batches))
      ...     timer.step_end(step)
      # step 100/1000: 8.13 ms/step, 31488 examples/s, 0:00:07 left
    """

    def __init__(
        self,
        total_steps: int | None = None,
        examples_per_step: int | None = None,
        *,
        every: int = 100,
        clock: Callable[[], float] = time.perf_counter,
        log: Callable[[str], Any] | None = None,
    ):
        if log is not None and not callable(log):
            raise TypeError(f"`log` must be callable, e.g. print; got {log!r}.")
        self._write = log or _default_log
        for label, value in (
            ("total_steps", total_steps),
            ("examples_per_step", examples_per_step),
            ("every", every),
        ):
            check_int(value, label, minimum=1, none=True)
        self.total_steps, self.examples_per_step = total_steps, examples_per_step
        self.every, self._clock = every, clock
        self._mark: tuple[int, float] | None = None  # (step, time) of the last report
        self.ms_per_step: float | None = None
        self.examples_per_second: float | None = None
        self.seconds_left: float | None = None

    def step_end(self, step: int) -> bool:
        """Records that `step` steps are done; reports if `step` is a multiple of `every`.

        Args:
          step: The number of steps done.

        Returns:
          Whether it reported.
        """
        now = self._clock()
        if self._mark is None or step <= self._mark[0]:  # the start, or a restart from earlier
            self._mark = (step, now)
            return False
        if step % self.every:
            return False
        done, elapsed = step - self._mark[0], now - self._mark[1]
        self._mark = (step, now)
        self.ms_per_step = 1e3 * elapsed / done
        seconds = elapsed / done
        if self.examples_per_step:
            self.examples_per_second = self.examples_per_step / seconds if seconds else None
        if self.total_steps:
            self.seconds_left = max(self.total_steps - step, 0) * seconds
        self._log(step)
        if tf.summary.should_record_summaries():
            summary_scalar("perf/ms_per_step", self.ms_per_step, step=step)
            if self.examples_per_second is not None:
                summary_scalar("perf/examples_per_second", self.examples_per_second, step=step)
        return True

    def _log(self, step: int) -> None:
        parts = [f"{self.ms_per_step:.2f} ms/step"]
        if self.examples_per_second is not None:
            parts.append(f"{self.examples_per_second:.0f} examples/s")
        if self.seconds_left is not None:
            parts.append(f"{datetime.timedelta(seconds=round(self.seconds_left))} left")
        where = f"{step}/{self.total_steps}" if self.total_steps else f"{step}"
        self._write(f"step {where}: {', '.join(parts)}")


def _default_log(line: str) -> None:
    """The INFO log under `absl.app`; stderr elsewhere (absl drops INFO there)."""
    if _under_absl_app():
        logging.info("%s", line)
    else:
        print(line, file=sys.stderr, flush=True)


def _under_absl_app() -> bool:
    """Whether absl parsed the flags (`absl.app.run` does), which sets its log's verbosity."""
    return flags.FLAGS.is_parsed()
