"""The registry of weights formats: which format a path names, and reading and writing by it.

`FORMATS` lists every format (`WeightsFormat` objects, one module each); nothing else of
`towers` names a format. A new format is a new module and an entry here. Every format
verifies its data when read: `.npz` members carry zip CRC-32s, `.h5` datasets written here a
CRC-32 attribute of their name and data, TensorFlow checkpoints their own CRC-32C per tensor.
Names that some format cannot hold are refused before anything is written.
"""

import os
import zipfile

import numpy as np
import tensorflow as tf

from towers.weights._format import WeightsFormat
from towers.weights._h5 import H5
from towers.weights._npz import Npz
from towers.weights._tf_checkpoint import TFCheckpoint

FORMATS: tuple[WeightsFormat, ...] = (Npz(), H5(), TFCheckpoint())
_BY_SUFFIX = {suffix: f for f in FORMATS for suffix in f.suffixes}
_DIRECTORIES = next(f for f in FORMATS if "" in f.suffixes)  # what a path without suffix is


def format_of(path: str, *, writing: bool = True) -> WeightsFormat:
    """The format `path` names by its suffix.

    Reading also accepts an existing path that some format recognizes under any name (a
    TensorFlow checkpoint directory, or a prefix such as "model.ckpt-1000" with its ".index").

    Args:
      path: A weights path.
      writing: Whether the path is about to be written (only its suffix counts).

    Returns:
      The format.

    Raises:
      ValueError: if the suffix names no format.
    """
    suffix = os.path.splitext(path)[1].lower()
    if suffix in _BY_SUFFIX:
        return _BY_SUFFIX[suffix]
    if not writing and _DIRECTORIES.recognizes(path):
        return _DIRECTORIES
    named = "; ".join(f.description for f in FORMATS)
    raise ValueError(
        f"`path` {path!r} ends in {suffix!r}, which names no weights format. Use {named}."
    )


def written_suffix(suffix: str) -> str:
    """The suffix files of the format `suffix` names are written with (".hdf5" -> ".h5").

    Args:
      suffix: A suffix some format takes, e.g. "" or ".hdf5".

    Returns:
      That format's first suffix.

    Raises:
      ValueError: if the suffix names no format.
    """
    return format_of(f"weights{suffix}").suffixes[0]


def written_suffixes() -> tuple[str, ...]:
    """Every format's first suffix, without the empty one: what written names end in."""
    return tuple(f.suffixes[0] for f in FORMATS if f.suffixes[0])


def write_arrays(path: str, arrays: dict[str, np.ndarray]) -> None:
    """Writes `arrays` to `path` in the format its suffix names, atomically.

    Args:
      path: Where to write.
      arrays: Name -> array.

    Raises:
      ValueError: if the suffix names no format, a name cannot be held by it, or a checkpoint
        directory would overwrite files `towers` did not write.
      TypeError: if a dtype cannot be held exactly by the format.
    """
    fmt = format_of(path)
    check_names(list(arrays), fmt)
    fmt.check_dtypes(arrays)
    fmt.write(path, arrays)


def check_names(names: list[str], fmt: WeightsFormat) -> None:
    """Refuses names that some format cannot hold, and what `fmt` itself cannot.

    Args:
      names: The names to write.
      fmt: The format to write them in.

    Raises:
      ValueError: listing every such name.
    """
    bad = [n for n in names if not _holdable(n)]
    if bad:
        raise ValueError(
            f"Weight names must be non-empty paths of non-empty parts (no leading, trailing or "
            f"double '/'), with no '.' or '..' part, no NUL character, and not start with "
            f"'_CHECKPOINTABLE_OBJECT_GRAPH'; got {sorted(set(bad))}. Name the variables with "
            "a dict target, e.g. {'dense/w': w}."
        )
    fmt.check_names(names)


def _holdable(name: str) -> bool:
    parts = name.split("/")
    return (
        all(part not in ("", ".", "..") for part in parts)
        and "\x00" not in name
        and not name.startswith("_CHECKPOINTABLE_OBJECT_GRAPH")
    )


def read_arrays(path: str) -> dict[str, np.ndarray]:
    """Reads and verifies every array of the weights file at `path`.

    Args:
      path: A file or directory of a registered format.

    Returns:
      Name -> array.

    Raises:
      FileNotFoundError: if `path` does not exist.
      ValueError: if the file is truncated, corrupt (a checksum differs), or of another format
        than its suffix says, or the suffix names no format.
    """
    if not os.path.exists(path) and not os.path.exists(path + ".index"):
        raise FileNotFoundError(f"No weights file at {path!r}.")
    fmt = format_of(path, writing=False)
    if os.path.isfile(path) and not fmt.recognizes(path):
        found = next((f for f in FORMATS if f is not fmt and f.recognizes(path)), None)
        described = f"{found.description} data" if found else "data of no known weights format"
        raise ValueError(
            f"{path!r} holds {described}, not what its name says. Name weights files by "
            "their content; a TensorFlow checkpoint is a directory or a prefix."
        )
    try:
        return fmt.read(path)
    except FileNotFoundError:
        raise
    except (
        OSError,
        ValueError,
        EOFError,
        KeyError,
        IndexError,
        RuntimeError,
        zipfile.BadZipFile,
        tf.errors.OpError,
    ) as error:
        raise ValueError(
            f"Cannot read weights from {path!r}: the file is truncated or corrupt, or unsafe "
            f"to read ({error})."
        ) from None


def weights_files_in(directory: str) -> list[str]:
    """The names in `directory` that a registered format names, newest first.

    Args:
      directory: Where to look; a missing one holds none.

    Returns:
      File names and checkpoint directories.
    """
    if not os.path.isdir(directory):
        return []
    found = []
    for entry in os.scandir(directory):
        fmt = _BY_SUFFIX.get(os.path.splitext(entry.name)[1].lower())
        if (fmt is not None and fmt is not _DIRECTORIES and entry.is_file()) or (
            entry.is_dir() and _DIRECTORIES.recognizes(entry.path)
        ):
            found.append((entry.stat().st_mtime, entry.name))
    return [name for _, name in sorted(found, reverse=True)]


def whole(path: str) -> bool:
    """Whether the weights at `path` (of the format its suffix names) were written whole.

    Args:
      path: A path written by `write_arrays`.

    Returns:
      Whether the write finished.
    """
    return format_of(path).whole(path)


def remove(path: str) -> None:
    """Removes what `write_arrays` wrote at `path` (nothing else), if anything.

    Args:
      path: A path written by `write_arrays`.
    """
    format_of(path).remove(path)
