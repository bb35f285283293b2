"""Weight file formats, chosen by suffix: `.npz`, `.h5`/`.hdf5`, or a TensorFlow checkpoint.

Every format verifies its data when read: `.npz` members carry zip CRC-32s, `.h5` datasets
written here a CRC-32 attribute of their name and data, TensorFlow checkpoints their own
CRC-32C per tensor. Names
that some format cannot hold are refused before anything is written.
"""

import os
import zipfile
import zlib

import numpy as np
import tensorflow as tf

from towers._atomic_files import atomic_write
from towers._checkpoint_dirs import read_checkpoint, write_checkpoint

SUFFIXES = {".npz": "npz", ".h5": "h5", ".hdf5": "h5", ".ckpt": "checkpoint", "": "checkpoint"}
_MAGIC = {b"PK\x03\x04": "npz", b"\x89HDF\r\n\x1a\n": "h5"}
_CRC = "towers_crc32"  # the attribute of an .h5 dataset holding its data's CRC-32


def format_of(path: str, *, writing: bool = True) -> str:
    """The format `path` names: "npz", "h5" or "checkpoint".

    Reading also accepts an existing TensorFlow checkpoint under any name (a directory, or a
    prefix such as "model.ckpt-1000" with its ".index" file).

    Raises:
      ValueError: if the suffix names no format.
    """
    suffix = os.path.splitext(path)[1].lower()
    if suffix in SUFFIXES:
        return SUFFIXES[suffix]
    if not writing and (os.path.isdir(path) or os.path.exists(path + ".index")):
        return "checkpoint"
    raise ValueError(
        f"`path` {path!r} ends in {suffix!r}, which names no weights format. Use .npz (numpy), "
        ".h5 or .hdf5 (HDF5), or no suffix or .ckpt for a TensorFlow checkpoint directory."
    )


def write(path: str, arrays: dict[str, np.ndarray]) -> None:
    """Writes `arrays` to `path` in the format its suffix names, atomically.

    Raises:
      ValueError: if the suffix names no format, a name cannot be held by it, or a checkpoint
        directory would overwrite files `towers` did not write.
      TypeError: if a dtype cannot be held exactly by the format.
    """
    fmt = format_of(path)
    check_names(list(arrays), fmt)
    if fmt == "checkpoint":
        write_checkpoint(path, arrays)
        return
    for name, array in arrays.items():
        if array.dtype.kind not in "biuf":
            raise TypeError(
                f"Variable {name!r} is {array.dtype}, which .{fmt} files cannot hold exactly. "
                "Save to a path without suffix or ending in .ckpt (a TensorFlow checkpoint)."
            )
    atomic_write(path, lambda temp: _WRITERS[fmt](temp, arrays))


def check_names(names: list[str], fmt: str) -> None:
    """Refuses names that some format cannot hold, and in .h5 a name inside another.

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
    if fmt == "h5":
        taken = set(names)
        nested = sorted(
            f"{prefix!r} and {name!r}"
            for name in names
            for prefix in _parents(name)
            if prefix in taken
        )
        if nested:
            raise ValueError(
                f"An .h5 file cannot hold a name and a name inside it (a dataset is not a "
                f"group): {', '.join(nested)}. Rename them, or save to .npz or a checkpoint."
            )


def _holdable(name: str) -> bool:
    parts = name.split("/")
    return (
        all(part not in ("", ".", "..") for part in parts)
        and "\x00" not in name
        and not name.startswith("_CHECKPOINTABLE_OBJECT_GRAPH")
    )


def _parents(name: str) -> list[str]:
    parts = name.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def read(path: str) -> dict[str, np.ndarray]:
    """Reads and verifies every array of the weights file at `path`.

    Raises:
      FileNotFoundError: if `path` does not exist.
      ValueError: if the file is truncated, corrupt (a checksum differs), or of another format
        than its suffix says, or the suffix names no format.
    """
    if not os.path.exists(path) and not os.path.exists(path + ".index"):
        raise FileNotFoundError(f"No weights file at {path!r}.")
    fmt = format_of(path, writing=False)
    if os.path.isfile(path):
        with open(path, "rb") as f:
            head = f.read(8)
        found = next((s for magic, s in _MAGIC.items() if head.startswith(magic)), None)
        if found != fmt:
            described = f".{found} data" if found else "data of no known weights format"
            raise ValueError(
                f"{path!r} holds {described}, not what its name says. Name .npz and .h5 files "
                "by their content; a TensorFlow checkpoint is a directory or a prefix."
            )
    try:
        return _READERS[fmt](path)
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
        if isinstance(error, FileNotFoundError):
            raise
        raise ValueError(
            f"Cannot read weights from {path!r}: the file is truncated or corrupt ({error})."
        ) from None


def _write_npz(path: str, arrays: dict[str, np.ndarray]) -> None:
    # Written member by member (not np.savez(**arrays)): names like "file" stay names.
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, array in arrays.items():
            with archive.open(name + ".npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asarray(array), allow_pickle=False)


def _read_npz(path: str) -> dict[str, np.ndarray]:
    # Reading a member whole checks its CRC-32 (zipfile raises BadZipFile on a mismatch).
    with np.load(path, allow_pickle=False) as archive:
        arrays = {name: archive[name] for name in archive.files}
    for name, array in arrays.items():
        if not isinstance(array, np.ndarray):  # np.load returns raw bytes for a non-array
            raise ValueError(f"member {name!r} is not an array")
    return arrays


def _write_h5(path: str, arrays: dict[str, np.ndarray]) -> None:
    h5py = _h5py()
    with h5py.File(path, "w") as f:
        for name, array in arrays.items():
            dataset = f.create_dataset(name, data=array)
            dataset.attrs[_CRC] = np.uint32(_crc32(name, array))


def _read_h5(path: str) -> dict[str, np.ndarray]:
    h5py = _h5py()
    found = {}

    def visit(name, node):
        if isinstance(node, h5py.Dataset):
            array = np.asarray(node[()])
            if _CRC in node.attrs and int(node.attrs[_CRC]) != _crc32(name, array):
                raise ValueError(f"the checksum of {name!r} does not match its data")
            found[name] = array

    with h5py.File(path, "r") as f:
        f.visititems(visit)
    return found


def _crc32(name: str, array: np.ndarray) -> int:
    """The CRC-32 of a dataset's name and data: a flipped bit in either is noticed."""
    return zlib.crc32(np.ascontiguousarray(array).tobytes(), zlib.crc32(name.encode()))


def _h5py():
    try:
        import h5py
    except ModuleNotFoundError:
        raise ImportError("`.h5` weight files need h5py: `pip install h5py`.") from None
    return h5py


_WRITERS = {"npz": _write_npz, "h5": _write_h5}
_READERS = {"npz": _read_npz, "h5": _read_h5, "checkpoint": read_checkpoint}
