"""How a `CheckpointManager` names its files, for it and for error messages elsewhere."""

import os
import re

INDEX = "checkpoints.json"
_CHECKPOINT = re.compile(r"^ckpt-(\d+)\.weights(\.npz|\.h5|)$")
_MANAGED = re.compile(r"^(ckpt-\d+\.(weights|state)|best-\d+\.weights)(\.npz|\.h5|)$")


def checkpoint_file(step: int, suffix: str, kind: str = "weights") -> str:
    """The file name of step `step`'s weights or state, e.g. "ckpt-00000100.weights.npz"."""
    return f"ckpt-{step:08d}.{kind}{suffix}"


def latest_checkpoint_file(directory: str) -> str | None:
    """The weights file of the highest step in `directory`, or None; for error messages."""
    if not os.path.isdir(directory):
        return None
    steps = {}
    for name in os.listdir(directory):
        match = _CHECKPOINT.match(name)
        if match:
            steps[int(match.group(1))] = name
    return os.path.join(directory, steps[max(steps)]) if steps else None


def managed_files(directory: str) -> set[str]:
    """The names in `directory` that a `CheckpointManager` writes (checkpoints and bests)."""
    if not os.path.isdir(directory):
        return set()
    return {name for name in os.listdir(directory) if _MANAGED.match(name)}
