"""Weight file formats, chosen by suffix: `.npz`, `.h5`, otherwise a TensorFlow checkpoint."""

import contextlib
import os
import uuid
import zipfile

import numpy as np

from towers._atomic_files import atomic_write, atomic_write_text, fsync_path
from towers.ops._tensorflow import tf

_MAGIC = {b"PK\x03\x04": ".npz", b"\x89HDF\r\n\x1a\n": ".h5"}
_STATE_FILE = "checkpoint"  # what tf.train.latest_checkpoint reads in a directory


def format_of(path: str) -> str:
    """The format `path` names: ".npz", ".h5" or "" (a TensorFlow checkpoint directory)."""
    suffix = os.path.splitext(path)[1].lower()
    return suffix if suffix in (".npz", ".h5") else ""


def write(path: str, arrays: dict[str, np.ndarray]) -> None:
    """Writes `arrays` to `path` in the format its suffix names, atomically."""
    suffix = format_of(path)
    if suffix in (".npz", ".h5"):
        for name, array in arrays.items():
            if array.dtype.kind not in "biuf":
                raise TypeError(
                    f"Variable {name!r} is {array.dtype}, which {suffix} files cannot hold "
                    "exactly. Save to a path without .npz/.h5 suffix (a TensorFlow checkpoint)."
                )
        atomic_write(path, lambda temp: _WRITERS[suffix](temp, arrays))
    else:
        _write_checkpoint(path, arrays)


def read(path: str) -> dict[str, np.ndarray]:
    """Reads every array of the weights file at `path`.

    Raises:
      FileNotFoundError: if `path` does not exist.
      ValueError: if the file is truncated, corrupt, or of another format than its suffix says.
    """
    suffix = format_of(path)
    if not os.path.exists(path) and not (suffix == "" and os.path.exists(path + ".index")):
        raise FileNotFoundError(f"No weights file at {path!r}.")
    if os.path.isfile(path):
        with open(path, "rb") as f:
            head = f.read(8)
        found = next((s for magic, s in _MAGIC.items() if head.startswith(magic)), None)
        if found != suffix:
            described = f"{found} data" if found else "data of no known weights format"
            raise ValueError(
                f"{path!r} holds {described}, not what its name says. Name .npz and .h5 files "
                "by their content; a TensorFlow checkpoint is a directory or a prefix."
            )
    try:
        return _READERS[suffix](path)
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
            f.create_dataset(name, data=array)


def _read_h5(path: str) -> dict[str, np.ndarray]:
    h5py = _h5py()
    found = {}
    with h5py.File(path, "r") as f:
        f.visititems(
            lambda name, node: (
                found.__setitem__(name, node[()]) if isinstance(node, h5py.Dataset) else None
            )
        )
    return {name: np.asarray(value) for name, value in found.items()}


def _h5py():
    try:
        import h5py
    except ModuleNotFoundError:
        raise ImportError("`.h5` weight files need h5py: `pip install h5py`.") from None
    return h5py


def _write_checkpoint(directory: str, arrays: dict[str, np.ndarray]) -> None:
    """A TensorFlow checkpoint in `directory`, committed by rewriting its state file.

    Each save writes a new uniquely named checkpoint, then atomically points the directory's
    "checkpoint" state file at it, then deletes the checkpoint it replaced; a crash in between
    leaves the state file naming a complete checkpoint.
    """
    if os.path.isfile(directory):
        raise ValueError(
            f"{directory!r} is a file; a path without .npz/.h5 suffix names a TensorFlow "
            "checkpoint directory."
        )
    os.makedirs(directory, exist_ok=True)
    prefix = f"weights-{uuid.uuid4().hex[:12]}"
    names = list(arrays)
    with tf.Graph().as_default() as graph:
        feeds = [tf.compat.v1.placeholder(tf.as_dtype(a.dtype), a.shape) for a in arrays.values()]
        save = tf.raw_ops.SaveV2(
            prefix=os.path.join(directory, prefix),
            tensor_names=names,
            shape_and_slices=[""] * len(names),
            tensors=feeds,
        )
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(save, dict(zip(feeds, arrays.values())))
    written = [n for n in os.listdir(directory) if n.startswith(prefix + ".")]
    for name in written:
        fsync_path(os.path.join(directory, name))
    state = f'model_checkpoint_path: "{prefix}"\nall_model_checkpoint_paths: "{prefix}"\n'
    atomic_write_text(os.path.join(directory, _STATE_FILE), state)
    for name in os.listdir(directory):
        if name.startswith("weights-") and not name.startswith(prefix + "."):
            with contextlib.suppress(OSError):
                os.remove(os.path.join(directory, name))


def _read_checkpoint(path: str) -> dict[str, np.ndarray]:
    prefix = tf.train.latest_checkpoint(path) if os.path.isdir(path) else path
    if prefix is None:
        raise FileNotFoundError(f"{path!r} is a directory without a TensorFlow checkpoint.")
    reader = tf.train.load_checkpoint(prefix)
    return {
        name: np.asarray(reader.get_tensor(name))
        for name in sorted(reader.get_variable_to_shape_map())
        if not name.startswith("_CHECKPOINTABLE_OBJECT_GRAPH")
    }


_WRITERS = {".npz": _write_npz, ".h5": _write_h5}
_READERS = {".npz": _read_npz, ".h5": _read_h5, "": _read_checkpoint}
