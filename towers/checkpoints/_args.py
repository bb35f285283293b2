"""The arguments a `CheckpointManager` checks where they are given."""

import math
import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import tensorflow as tf

from towers.files import as_path
from towers.ops.internal import check_int
from towers.variables import Target


def checked_extra(extra: Mapping[str, Target] | None) -> dict[str, Target]:
    """The extra state by key; keys are names without '/' (they become name prefixes)."""
    if extra is None:
        return {}
    if not isinstance(extra, Mapping) or not all(
        isinstance(k, str) and k and "/" not in k for k in extra
    ):
        raise TypeError(
            f"`extra` must map names without '/' to state (tf.Modules, lists or dicts of "
            f"variables, tf.data iterators, staged inputs); got {extra!r}."
        )
    return dict(extra)


def check_options(
    every_n_steps: Any, keep_last: Any, monitor: Any, suffix: Any, suffixes: Any
) -> None:
    """The manager's numeric and named options: a TypeError or ValueError naming one off."""
    check_int(every_n_steps, "every_n_steps", minimum=1, none=True)
    check_int(keep_last, "keep_last", minimum=1)
    if monitor not in (None, "min", "max"):
        raise ValueError(f"`monitor` must be 'min', 'max' or None; got {monitor!r}.")
    if suffix not in suffixes:
        raise ValueError(f"`suffix` must be one of {sorted(suffixes)}; got {suffix!r}.")


def checked_directory(directory: Any) -> str:
    """The checkpoint directory as a path: not empty, not a file."""
    path = as_path(directory, "directory")
    if not path:
        raise ValueError("`directory` must name a directory; got ''.")
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"`directory` {path!r} is a file; CheckpointManager needs a directory.")
    return path


def check_session(session: Any) -> None:
    """A v1 graph needs its session: the manager reads and assigns variables through it."""
    if session is None and not tf.executing_eagerly():
        raise ValueError(
            "In a v1 graph the manager reads and assigns variables through a session: pass "
            "CheckpointManager(..., session=sess)."
        )


def check_step(step: Any) -> int:
    """`step` as an int >= 0 that int64 holds, or a TypeError or ValueError naming it."""
    return check_int(step, "step", minimum=0, maximum=2**63 - 1)


def finite_number(value: Any) -> float | None:
    """`value` as a float if it is a finite real number, else None."""
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        return float(value) if math.isfinite(value) else None
    return None
