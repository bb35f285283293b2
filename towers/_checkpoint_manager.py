"""A checkpoint manager for training loops: periodic saves, keep last k, keep best, resume."""

import contextlib
import json
import math
import os
from typing import Any

import numpy as np

from towers import _weight_formats
from towers._atomic_files import atomic_write_text
from towers._checkpoint_files import INDEX, checkpoint_file, managed_files
from towers._optimizer import StatefulOptimizer
from towers._weight_targets import Target, named_variables, variable_copies
from towers._weights_io import restore_arrays, restore_weights, save_weights

_STEP = "__step__"


class CheckpointManager:
    """Saves weights, optimizer state and the step counter; keeps the last k and the best.

    Every checkpoint is two files in `directory`: the weights under canonical names (load them
    with `towers.restore_weights` into any program, single-device included) and the state (the
    optimizer's variables and the step). A JSON index, rewritten atomically after both files,
    says which checkpoints are complete, so a crash never leaves a half checkpoint in use.
    Names carry no tower prefix, so a run saved with K towers resumes with any other number.

    Args:
      directory: Where the checkpoints live; created if needed. One writer at a time.
      model: The weights target: a `tf.Module`, a list or dict of variables, or a strategy
        holding its own copies (`towers.Replicated`).
      optimizer: Optional; its state is saved, named as a weights target (`towers.SGD` names
        it per variable, one entry for all replicas' copies). If it builds its state on
        request (`build(variables)`), save and restore call it first with every copy of the
        model's variables, so that state it creates lazily (e.g. momentum of a variable
        without gradient yet) is always complete.
      every_n_steps: `step_end` saves when the step is a multiple of this; None: never.
      keep_last: How many regular checkpoints to keep, >= 1.
      monitor: "min" or "max" to keep the best weights by the value given to `save`, like
        Keras' `ModelCheckpoint(save_best_only=True)`; None to keep no best.
      suffix: The format: ".npz" (default: numpy alone reads it), ".h5" (faster), or "" for
        TensorFlow checkpoints.

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
        if every_n_steps is not None and (not isinstance(every_n_steps, int) or every_n_steps < 1):
            raise ValueError(
                f"`every_n_steps` must be a positive int or None; got {every_n_steps!r}."
            )
        if not isinstance(keep_last, int) or keep_last < 1:
            raise ValueError(f"`keep_last` must be a positive int; got {keep_last!r}.")
        if monitor not in (None, "min", "max"):
            raise ValueError(f"`monitor` must be 'min', 'max' or None; got {monitor!r}.")
        if suffix not in (".npz", ".h5", ""):
            raise ValueError(f"`suffix` must be '.npz', '.h5' or ''; got {suffix!r}.")
        self.directory = os.fspath(directory)
        self.model, self.optimizer = model, optimizer
        self.every_n_steps, self.keep_last = every_n_steps, keep_last
        self.monitor, self.suffix = monitor, suffix
        self._index = self._read_index()

    @property
    def steps(self) -> list[int]:
        """The steps of the checkpoints kept, oldest first."""
        return [c["step"] for c in self._index["checkpoints"]]

    @property
    def latest_weights(self) -> str | None:
        """Path of the newest checkpoint's weights, or None."""
        kept = self._index["checkpoints"]
        return os.path.join(self.directory, kept[-1]["weights"]) if kept else None

    @property
    def best_weights(self) -> str | None:
        """Path of the best weights so far, or None."""
        best = self._index["best"]
        return os.path.join(self.directory, best["weights"]) if best else None

    @property
    def best_value(self) -> float | None:
        """The monitored value of the best weights, or None."""
        return self._index["best"]["value"] if self._index["best"] else None

    def step_end(self, step: int, value: float | None = None) -> bool:
        """Saves if `step` is a multiple of `every_n_steps`; call it after every step.

        Args:
          step: The number of steps done.
          value: The monitored value, as for `save`.

        Returns:
          Whether it saved.
        """
        if self.every_n_steps is None or step % self.every_n_steps:
            return False
        self.save(step, value)
        return True

    def save(self, step: int, value: float | None = None) -> str:
        """Saves a checkpoint of `step` now, and the best weights if `value` improved.

        Args:
          step: The number of steps done; restore returns it.
          value: The monitored value (e.g. a validation loss); required when `monitor` is set.

        Returns:
          The path of the weights written.

        Raises:
          ValueError: if `monitor` is set and `value` is missing or not a finite number.
        """
        if self.monitor and (value is None or not math.isfinite(value)):
            raise ValueError(
                f"`value` must be a finite number when monitor={self.monitor!r}; got {value!r}."
            )
        weights = checkpoint_file(step, self.suffix)
        state = checkpoint_file(step, self.suffix, kind="state")
        save_weights(self.model, os.path.join(self.directory, weights))
        _weight_formats.write(os.path.join(self.directory, state), self._state_arrays(step))
        index = dict(self._index)
        kept = [c for c in index["checkpoints"] if c["step"] != step]
        index["checkpoints"] = (kept + [{"step": step, "weights": weights, "state": state}])[
            -self.keep_last :
        ]
        if self.monitor and self._improves(value):
            best = f"best-{step:08d}.weights{self.suffix}"
            save_weights(self.model, os.path.join(self.directory, best))
            index["best"] = {"step": step, "value": float(value), "weights": best}
        self._write_index(index)
        return os.path.join(self.directory, weights)

    def restore_latest(self) -> int:
        """Restores the newest checkpoint's weights and optimizer state; returns its step.

        Returns:
          The step saved with it, or 0 when there is no checkpoint (a fresh start).
        """
        if not self._index["checkpoints"]:
            return 0
        latest = self._index["checkpoints"][-1]
        restore_weights(self.model, os.path.join(self.directory, latest["weights"]))
        arrays = _weight_formats.read(os.path.join(self.directory, latest["state"]))
        if self.optimizer is not None:
            self._build_optimizer()
            state = {k: v for k, v in arrays.items() if k != _STEP}
            restore_arrays(variable_copies(self.optimizer), state, latest["state"])
        return int(arrays[_STEP])

    def _build_optimizer(self) -> None:
        """Creates all of the optimizer's lazy state, so saved and restored state agree."""
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

    def _read_index(self) -> dict:
        path = os.path.join(self.directory, INDEX)
        if not os.path.exists(path):
            return {"checkpoints": [], "best": None}
        try:
            with open(path) as f:
                index = json.load(f)
        except ValueError as error:
            raise ValueError(f"The checkpoint index {path!r} is corrupt ({error}).") from None
        if not isinstance(index, dict) or not {"checkpoints", "best"} <= index.keys():
            raise ValueError(f"The checkpoint index {path!r} is corrupt (keys missing).")
        return index

    def _write_index(self, index: dict) -> None:
        atomic_write_text(os.path.join(self.directory, INDEX), json.dumps(index, indent=1))
        self._index = index
        # Dropped checkpoints, and files of saves killed before their index was written.
        for name in managed_files(self.directory) - set(_files(index)):
            _remove(os.path.join(self.directory, name))


def _files(index: dict) -> list[str]:
    files = [f for c in index["checkpoints"] for f in (c["weights"], c["state"])]
    return files + ([index["best"]["weights"]] if index["best"] else [])


def _remove(path: str) -> None:
    """Removes a checkpoint file or TensorFlow checkpoint directory."""
    with contextlib.suppress(OSError):
        if os.path.isdir(path):
            for name in os.listdir(path):
                os.remove(os.path.join(path, name))
            os.rmdir(path)
        else:
            os.remove(path)
