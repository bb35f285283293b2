"""The names of a `CheckpointManager` directory's files, and how to tell one is whole or go.

`ckpt-<step>[.<serial>].weights<ext>`, `...state<ext>` and `...json` (the record) for a
checkpoint, `best-<step>[.<serial>]...` for a best weights file; a re-save of a step gets the
next serial, so it never overwrites the save it replaces.
"""

import contextlib
import os
import re

from towers._checkpoint_dirs import remove_checkpoint_dir

INDEX = "checkpoints.json"
LOCK = "checkpoints.lock"
EXTENSIONS = {".npz": ".npz", ".h5": ".h5", ".hdf5": ".h5", ".ckpt": ".ckpt", "": ".ckpt"}
NAME = re.compile(
    r"(?P<kind>ckpt|best)-(?P<step>\d{8,})(?:\.(?P<serial>\d+))?"
    r"\.(?:(?P<role>weights|state)(?:\.npz|\.h5|\.ckpt)?|json)"
)


def base_name(kind: str, step: int, serial: int) -> str:
    """The name every file of one save starts with, e.g. "ckpt-00000100.1"."""
    return f"{kind}-{step:08d}" + (f".{serial}" if serial else "")


def managed(directory: str) -> dict[str, tuple[str, int, int]]:
    """The names in `directory` that a manager's files have: name -> (kind, step, serial).

    A name alone proves nothing: a user may have a file of that name. Records prove it.
    """
    if not os.path.isdir(directory):
        return {}
    found = {}
    for name in os.listdir(directory):
        match = NAME.fullmatch(name)
        if match:
            found[name] = (match["kind"], int(match["step"]), int(match["serial"] or 0))
    return found


def next_serial(directory: str, kind: str, step: int) -> int:
    """A serial no file of `kind` and `step` uses yet (a killed save's leftovers included)."""
    used = [s for k, st, s in managed(directory).values() if (k, st) == (kind, step)]
    return max(used) + 1 if used else 0


def whole(path: str) -> bool:
    """Whether a weights or state file (written atomically) or checkpoint directory is whole.

    A checkpoint directory is whole once its "checkpoint" state file, written last, exists.
    """
    if os.path.isdir(path):
        return os.path.exists(os.path.join(path, "checkpoint"))
    return os.path.exists(path)


def remove(path: str) -> None:
    """Removes a file, or what towers wrote in a checkpoint directory (and it, if then empty)."""
    with contextlib.suppress(OSError):
        if os.path.isdir(path):
            remove_checkpoint_dir(path)
        elif os.path.exists(path):
            os.remove(path)
