"""A checkpoint manager for training loops: periodic saves, keep last k, keep best, resume."""

import math
import os
from typing import Any

import numpy as np

from towers import _weight_formats
from towers._atomic_files import as_path, atomic_write_text
from towers._checkpoint_files import (
    EXTENSIONS,
    LOCK,
    Record,
    adopt_old_index,
    kept,
    managed,
    new_record,
    next_serial,
    remove,
    scan,
    to_json,
    write_index,
)
from towers._directory_lock import DirectoryLock
from towers._optimizer import StatefulOptimizer, check_checkpointable
from towers._weight_targets import Target, named_variables, variable_copies
from towers._weights_io import assign_arrays, match_arrays, save_weights

_STEP = "__step__"


class CheckpointManager:
    """Saves weights, optimizer state and the step counter; keeps the last k and the best.

    Every checkpoint is a weights file under canonical names (load it with
    `towers.restore_weights` into any program, single-device included), a state file (the
    optimizer's variables and the step) and a JSON record naming both, written last: the
    record is the commit, so a save killed at any moment leaves the previous checkpoints
    whole, a re-save of a step never overwrites the save it replaces, and the directory
    describes itself. `checkpoints.json` indexes the complete checkpoints and the best; when
    it is lost or corrupt it is rebuilt from the records. Only files of the manager's own
    names are ever deleted, and only once a newer save supersedes them.

    One writer per directory: the manager holds an OS lock on `checkpoints.lock` from
    construction until `close()` (or until the process ends); a second manager on the same
    directory, in any process, gets an error naming the holder. Names carry no tower prefix,
    so a run saved with K towers resumes with any other number.

    Args:
      directory: Where the checkpoints live; created if needed.
      model: The weights target: a `tf.Module`, a list or dict of variables, or a strategy
        holding its own copies (`towers.Replicated`).
      optimizer: Optional; its state is saved: a `towers` optimizer (`towers.SGD`, its state
        per variable, one entry for all replicas' copies, built up front), or a `tf.Module`,
        list or dict of the optimizer's variables.
      every_n_steps: `step_end` saves when the step is a multiple of this; None: never.
      keep_last: How many regular checkpoints to keep, >= 1.
      monitor: "min" or "max" to keep the best weights by the value given to `save`, like
        Keras' `ModelCheckpoint(save_best_only=True)`; None to keep no best.
      suffix: The format: ".npz" (default: numpy alone reads it), ".h5" (faster), or ".ckpt"
        (or "") for TensorFlow checkpoints.

    Raises:
      ValueError: for an argument out of range.
      TypeError: for an optimizer whose state cannot be saved.
      RuntimeError: if another manager writes to `directory`.

    Example:
      >>> manager = towers.CheckpointManager("ckpt", model, optimizer, every_n_steps=100,
      ...                                    monitor="min")
      >>> step = manager.restore_latest()       # 0 on a fresh start
      >>> while step < num_steps:
      ...     loss = train(next_batch(step)); step += 1
      ...     manager.step_end(step, value=float(loss))
      >>> manager.save(step, value=float(loss))  # at the end
    """

    def __init__(
        self,
        directory: str,
        model: Target,
        optimizer: Any = None,
        *,
        every_n_steps: int | None = None,
        keep_last: int = 3,
        monitor: str | None = None,
        suffix: str = ".npz",
    ):
        if every_n_steps is not None and (not _is_int(every_n_steps) or every_n_steps < 1):
            raise ValueError(
                f"`every_n_steps` must be a positive int or None; got {every_n_steps!r}."
            )
        if not _is_int(keep_last) or keep_last < 1:
            raise ValueError(f"`keep_last` must be a positive int; got {keep_last!r}.")
        if monitor not in (None, "min", "max"):
            raise ValueError(f"`monitor` must be 'min', 'max' or None; got {monitor!r}.")
        if suffix not in EXTENSIONS:
            raise ValueError(f"`suffix` must be one of {sorted(EXTENSIONS)}; got {suffix!r}.")
        check_checkpointable(optimizer)
        self.directory = as_path(directory, "directory")
        if os.path.exists(self.directory) and not os.path.isdir(self.directory):
            raise ValueError(
                f"`directory` {self.directory!r} is a file; CheckpointManager needs a directory."
            )
        self.model, self.optimizer = model, optimizer
        self.every_n_steps, self.keep_last = every_n_steps, keep_last
        self.monitor, self.suffix = monitor, suffix
        self._lock = DirectoryLock(self.directory, LOCK)
        if not any(name.endswith(".json") for name in managed(self.directory)):
            adopt_old_index(self.directory)  # a towers 0.1 directory: its index has the values
        self._records = scan(self.directory)
        for record in self._records:  # saves whose record was lost describe themselves again
            if not os.path.exists(self._path(record.name)):
                atomic_write_text(self._path(record.name), to_json(record))
        self._checkpoints, self._best = kept(self._records, keep_last, monitor)
        write_index(self.directory, self._checkpoints, self._best)

    def __enter__(self) -> "CheckpointManager":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        """Releases the directory for another writer; the manager cannot save after it."""
        self._lock.release()

    @property
    def steps(self) -> list[int]:
        """The steps of the checkpoints kept, oldest first."""
        return [r.step for r in self._checkpoints]

    @property
    def latest_weights(self) -> str | None:
        """Path of the newest checkpoint's weights, or None."""
        return self._path(self._checkpoints[-1].weights) if self._checkpoints else None

    @property
    def best_weights(self) -> str | None:
        """Path of the best weights so far, or None."""
        return self._path(self._best.weights) if self._best else None

    @property
    def best_value(self) -> float | None:
        """The monitored value of the best weights, or None."""
        return self._best.value if self._best else None

    def step_end(self, step: int, value: float | None = None) -> bool:
        """Saves if `step` is a multiple of `every_n_steps`; call it after every step.

        Args:
          step: The number of steps done.
          value: The monitored value, as for `save`.

        Returns:
          Whether it saved.

        Raises:
          ValueError: as `save`.
        """
        step = _check_step(step)
        if self.every_n_steps is None or step % self.every_n_steps:
            return False
        self.save(step, value)
        return True

    def save(self, step: int, value: float | None = None) -> str:
        """Saves a checkpoint of `step` now, and the best weights if `value` improved.

        All or nothing: until its record is written, the save does not exist, and the
        checkpoints before it stay as they were.

        Args:
          step: The number of steps done, an int >= 0; restore returns it.
          value: The monitored value (e.g. a validation loss); required when `monitor` is set.

        Returns:
          The path of the weights written.

        Raises:
          ValueError: if `step` is not an int >= 0, or `monitor` is set and `value` is
            missing or not a finite number.
          RuntimeError: after `close()`.
        """
        step, number = _check_step(step), _finite(value)
        if self.monitor and number is None:
            raise ValueError(
                f"`value` must be a finite number when monitor={self.monitor!r}; got {value!r}."
            )
        if not self._lock.held:
            raise RuntimeError(f"This CheckpointManager of {self.directory!r} is closed.")
        value = number
        saved = [self._write("ckpt", step, value)]
        if self.monitor and self._improves(value):
            saved.append(self._write("best", step, value))
        self._records = self._records + saved
        self._checkpoints, self._best = kept(self._records, self.keep_last, self.monitor)
        write_index(self.directory, self._checkpoints, self._best)
        self._remove_superseded()
        return self._path(saved[0].weights)

    def restore_latest(self, *, strict: bool = True) -> int:
        """Restores the newest checkpoint's weights and optimizer state; returns its step.

        All or nothing: weights, optimizer state and step are read and checked first, and
        assigned only when all match (or, with `strict=False`, whatever matches).

        Args:
          strict: Whether a missing, unexpected or mismatched name is an error.

        Returns:
          The step saved with it, or 0 when there is no checkpoint (a fresh start).

        Raises:
          ValueError: if a file is corrupt, or (strict) weights or state do not match.
        """
        if not self._checkpoints:
            return 0
        latest = self._checkpoints[-1]
        weights = _weight_formats.read(self._path(latest.weights))
        state = _weight_formats.read(self._path(latest.state))
        if _STEP not in state or int(state[_STEP]) != latest.step:
            raise ValueError(f"The state file {latest.state!r} does not hold step {latest.step}.")
        plans = [(variable_copies(self.model), weights, latest.weights)]
        if self.optimizer is not None:
            self._build_optimizer()
            optimizer_state = {k: v for k, v in state.items() if k != _STEP}
            plans.append((variable_copies(self.optimizer), optimizer_state, latest.state))
        reports = [match_arrays(c, a, self._path(where), strict=strict) for c, a, where in plans]
        for (copies, arrays, _), report in zip(plans, reports):
            assign_arrays(copies, arrays, report)
        return latest.step

    def _write(self, kind: str, step: int, value: float | None) -> Record:
        """Writes one save's files, the record last (the commit)."""
        serial = next_serial(self.directory, kind, step)
        extension = EXTENSIONS[self.suffix]
        record = new_record(kind, step, serial, extension, value)
        save_weights(self.model, self._path(record.weights))
        if record.state:
            _weight_formats.write(self._path(record.state), self._state_arrays(step))
        atomic_write_text(self._path(record.name), to_json(record))
        return record

    def _remove_superseded(self) -> None:
        """Deletes the manager's own files that no kept save uses (never anything else)."""
        in_use = {f for r in [*self._checkpoints, self._best] if r for f in r.files}
        for name in managed(self.directory):
            if name not in in_use:
                remove(self._path(name))
        self._records = [*self._checkpoints, *([self._best] if self._best else [])]

    def _build_optimizer(self) -> None:
        """Creates all of a towers optimizer's lazy state, so saved and restored state agree."""
        if isinstance(self.optimizer, StatefulOptimizer):
            copies = variable_copies(self.model).values()
            self.optimizer.build([var for group in copies for var in group])

    def _improves(self, value: float) -> bool:
        best = self.best_value
        return best is None or (value < best if self.monitor == "min" else value > best)

    def _state_arrays(self, step: int) -> dict[str, np.ndarray]:
        arrays = {_STEP: np.asarray(step, np.int64)}
        if self.optimizer is not None:
            self._build_optimizer()
            arrays.update({n: v.numpy() for n, v in named_variables(self.optimizer).items()})
        return arrays

    def _path(self, name: str) -> str:
        return os.path.join(self.directory, name)


def _check_step(step: Any) -> int:
    if not _is_int(step) or step < 0:
        raise ValueError(f"`step` must be an int >= 0; got {step!r}.")
    return int(step)


def _finite(value: Any) -> float | None:
    """`value` as a float if it is a finite real number, else None."""
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        return float(value) if math.isfinite(value) else None
    return None


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)
