"""The arguments a `CheckpointManager` checks where they are given."""

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from towers._weight_targets import Target
from towers.ops._tensorflow import tf


def checked_extra(extra: Mapping[str, Target] | None) -> dict[str, Target]:
    """The extra state by key; keys are names without '/' (they become name prefixes)."""
    if extra is None:
        return {}
    if not isinstance(extra, Mapping) or not all(
        isinstance(k, str) and k and "/" not in k for k in extra
    ):
        raise TypeError(
            f"`extra` must map names without '/' to state (tf.Modules, lists or dicts of "
            f"variables, tf.data iterators); got {extra!r}."
        )
    return dict(extra)


def check_session(session: Any) -> None:
    """A v1 graph needs its session: the manager reads and assigns variables through it."""
    if session is None and not tf.executing_eagerly():
        raise ValueError(
            "In a v1 graph the manager reads and assigns variables through a session: pass "
            "CheckpointManager(..., session=sess)."
        )


def check_step(step: Any) -> int:
    """`step` as an int, or a ValueError naming it (an int >= 0 that int64 holds)."""
    if not is_int(step) or not 0 <= step < 2**63:
        raise ValueError(f"`step` must be an int >= 0 (and < 2**63); got {step!r}.")
    return int(step)


def finite_number(value: Any) -> float | None:
    """`value` as a float if it is a finite real number, else None."""
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        return float(value) if math.isfinite(value) else None
    return None


def is_int(value: Any) -> bool:
    """Whether `value` is a Python or numpy integer (not a bool)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)
