"""A checkpoint manager for training loops: periodic saves, keep last k, keep best, resume."""

import dataclasses
import os
import threading
from collections.abc import Mapping
from typing import Any

import tensorflow as tf

from towers.checkpoints._args import (
    check_options,
    check_session,
    check_step,
    checked_directory,
    checked_extra,
    finite_number,
)
from towers.checkpoints._files import EXTENSIONS, LOCK, NAME, next_serial, remove
from towers.checkpoints._records import (
    Record,
    kept,
    new_record,
    scan,
    superseded,
    warn_damaged,
    write_index,
    write_record,
)
from towers.checkpoints._shares import ChiefShares, spans_workers
from towers.checkpoints._state import restore_checkpoint, state_arrays, state_copies
from towers.files import DirectoryLock, remove_stale_temporaries
from towers.optimizers import check_checkpointable
from towers.variables import Target
from towers.weights import save_weights, write_arrays
from towers.workers import current_workers


class CheckpointManager:
    """Saves weights, optimizer state and the step counter; keeps the last k and the best.

    Every checkpoint is a weights file under canonical names (load it with
    `towers.restore_weights` into any program, single-device included), a state file (the
    optimizer's variables and the step) and a JSON record (`_checkpoint_records`): a save
    killed at any moment leaves the previous checkpoints whole, a re-save never overwrites
    the save it replaces, and only files the manager's records name are ever deleted, once
    superseded. `checkpoints.json` indexes what is kept and is rebuilt when lost. One writer
    per directory: an OS lock on `checkpoints.lock`, held until `close()`. Names carry no
    tower prefix, so a run saved with K towers resumes with any other number. Across workers
    only the chief writes (sharded state: what other workers keep is gathered to it, so every
    worker calls `save` alike); every worker restores from the (shared or copied) directory.

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
      extra: More state to keep with the optimizer's, by key: e.g. `{"loss_scale":
        towers.DynamicLossScale()}`; each a `tf.Module`, list or dict of variables, or a
        `tf.data` iterator (`iter(dataset)`), whose position (shuffle buffer included) is
        saved through TensorFlow's iterator checkpointing, so that a resumed run reads the
        batches an uninterrupted one would, or a `towers.StagedInput` (its position and the
        batch staged on the devices, restored into any number of towers).
      session: For variables of a v1 graph, the `tf.compat.v1.Session` holding their values
        (saves read them and restores assign them there); required in a v1 graph.

    Raises:
      ValueError: for an argument out of range, or a v1 graph without `session`.
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
        extra: Mapping[str, Target] | None = None,
        session: tf.compat.v1.Session | None = None,
    ):
        check_options(every_n_steps, keep_last, monitor, suffix, EXTENSIONS)
        check_session(session)
        check_checkpointable(optimizer)
        self.extra = checked_extra(extra)
        self.directory = checked_directory(directory)
        self.model, self.optimizer, self.session = model, optimizer, session
        self.every_n_steps, self.keep_last = every_n_steps, keep_last
        self.monitor, self.suffix = monitor, suffix
        self._thread_lock = threading.Lock()
        self._shares = None  # sharded across workers: what the chief gathers at each save
        if spans_workers(model):
            local = state_copies(model, optimizer, self.extra)
            self._shares = ChiefShares(model, optimizer, self.extra, local, session)
        self.writes = current_workers().is_chief  # other workers read what the chief writes
        if not self.writes:
            self._lock, self._records = None, scan(self.directory, repair=False).usable
            self._checkpoints, self._best = kept(self._records, keep_last, monitor)
            return
        self._lock = DirectoryLock(self.directory, LOCK, holder="another CheckpointManager")
        try:
            remove_stale_temporaries(self.directory, NAME.pattern)
            found = scan(self.directory, repair=True)
            self._records = found.usable
            self._forget(found.killed)  # saves killed before their commit: ours, to delete
            warn_damaged(self.directory, found.damaged)
            self._checkpoints, self._best = kept(self._records, keep_last, monitor)
            write_index(self.directory, self._checkpoints, self._best)
        except BaseException:
            self._lock.release()
            raise

    def __enter__(self) -> "CheckpointManager":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        """Releases the directory for another writer; the manager cannot save after it."""
        if self._lock is not None:
            self._lock.release()
        self._closed = True

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
        step = check_step(step)
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
          The path of the weights written ("" on a worker other than the chief, which
          writes nothing: the chief's copy of the variables is every worker's).

        Raises:
          ValueError: if `step` is not an int >= 0, or `monitor` is set and `value` is
            missing or not a finite number.
          RuntimeError: after `close()`.
        """
        step, number = check_step(step), finite_number(value)
        if self.monitor and number is None:
            raise ValueError(
                f"`value` must be a finite number when monitor={self.monitor!r}; got {value!r}."
            )
        self._check_open()
        shares = self._shares.arrays() if self._shares is not None else {}  # on every worker
        if not self.writes:
            return ""
        with self._thread_lock:
            self._check_open()
            if self._checkpoints and step < self._checkpoints[-1].step:
                raise ValueError(
                    f"`step` {step} is below the newest checkpoint in {self.directory!r} "
                    f"(step {self._checkpoints[-1].step}); it would be older than the saves "
                    "kept. Restore first (`restore_latest()`) or use a new directory."
                )
            record = self._write("ckpt", step, number, shares)
            if self.monitor and self._improves(number):
                self._write("best", step, number, shares)
            self._checkpoints, self._best = kept(self._records, self.keep_last, self.monitor)
            write_index(self.directory, self._checkpoints, self._best)
            self._remove_superseded()
        return self._path(record.weights)

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
        self._check_open()
        if not self.writes:  # what the chief has written by now
            self._records = scan(self.directory, repair=False).usable
            self._checkpoints, self._best = kept(self._records, self.keep_last, self.monitor)
        if not self._checkpoints:
            return 0
        latest = self._checkpoints[-1]
        paths = self._path(latest.weights), self._path(latest.state)
        targets = self.model, self.optimizer, self.extra
        restore_checkpoint(*targets, *paths, latest.step, strict=strict, session=self.session)
        return latest.step

    def _write(
        self, kind: str, step: int, value: float | None, shares: dict | None = None
    ) -> Record:
        """Writes one save: its pending record, its files, its complete record (the commit)."""
        serial = next_serial(self.directory, kind, step)
        monitor = self.monitor if kind == "best" else None
        pending = new_record(
            kind, step, serial, EXTENSIONS[self.suffix], value=value, monitor=monitor
        )
        write_record(self.directory, pending)
        self._records.append(pending)  # its files are ours from now on, whatever happens
        save_weights(self.model, self._path(pending.weights), session=self.session)
        if pending.state:
            targets = self.model, self.optimizer, self.extra
            arrays = state_arrays(*targets, step, self.session, shares)
            write_arrays(self._path(pending.state), arrays)
        record = dataclasses.replace(pending, complete=True)
        write_record(self.directory, record)
        self._records[self._records.index(pending)] = record
        return record

    def _remove_superseded(self) -> None:
        """Deletes the files of the manager's own saves that are superseded, nothing else."""
        self._forget(superseded(self._records, [*self._checkpoints, self._best], self.monitor))

    def _forget(self, records: list[Record]) -> None:
        """Deletes the files of `records` (all the manager's own), each record last."""
        for record in records:
            for name in record.files:  # the record file last: until then it names the rest
                remove(self._path(name))
        self._records = [r for r in self._records if r not in records]

    def _check_open(self) -> None:
        if getattr(self, "_closed", False) or (self._lock is not None and not self._lock.held):
            raise RuntimeError(f"This CheckpointManager of {self.directory!r} is closed.")

    def _improves(self, value: float) -> bool:
        if self._best is not None and self._best.value is None:  # its record was lost
            return False
        best = self.best_value
        return best is None or (value < best if self.monitor == "min" else value > best)

    def _path(self, name: str) -> str:
        return os.path.join(self.directory, name)
