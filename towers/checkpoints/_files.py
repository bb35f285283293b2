"""The names of a `CheckpointManager` directory's files, and how to tell one is whole or go.

`ckpt-<step>[.<serial>].weights<ext>`, `...state<ext>` and `...json` (the record) for a
checkpoint, `best-<step>[.<serial>]...` for a best weights file; a re-save of a step gets the
next serial, so it never overwrites the save it replaces.
"""

import contextlib
import os
import re

from towers.weights import FORMATS, written_suffix, written_suffixes
from towers.weights import remove as remove_weights

INDEX = "checkpoints.json"
LOCK = "checkpoints.lock"
# The suffixes the manager takes (every weights format's) and writes (each format's first).
EXTENSIONS = {s: written_suffix(s) for f in FORMATS for s in f.suffixes}
NAME = re.compile(
    r"(?P<kind>ckpt|best)-(?P<step>\d{8,})(?:\.(?P<serial>\d+))?"
    r"\.(?:(?P<role>weights|state)(?:"
    + "|".join(re.escape(s) for s in written_suffixes())
    + r")?|json)"
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


def remove(path: str) -> None:
    """Removes one of a checkpoint's files: a record, or what a weights format wrote.

    Args:
      path: A file of a checkpoint.
    """
    if NAME.fullmatch(os.path.basename(path))["role"]:
        remove_weights(path)
        return
    with contextlib.suppress(OSError):
        os.remove(path)
