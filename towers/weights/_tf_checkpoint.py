"""The TensorFlow-checkpoint weights format: a directory `tf.train.load_checkpoint` reads.

A directory is written only when it is new or empty, or was written by `towers` before (it
holds the marker file, or only files of the names written here); only files of those names
are ever replaced or removed, so a user's folder (a `tf.train` checkpoint, notes, data) is
never touched.
"""

import contextlib
import json
import os
import re
import time
import uuid

import numpy as np
import tensorflow as tf

from towers.files import DirectoryLock, atomic_write_text, fsync_path
from towers.weights._format import WeightsFormat

MARKER = "towers-weights.json"  # says: towers wrote this directory
LOCK = ".towers-weights.lock"  # one save at a time
_STATE_FILE = "checkpoint"  # what tf.train.latest_checkpoint reads in a directory
# The files of one save, and TensorFlow's temporaries of them.
_OURS = re.compile(r"weights-[0-9a-f]{12}\.(index|data-\d{5}-of-\d{5})(\.tempstate\d+)?")
# Everything a save writes here: the above, the marker, the lock, the state file and the
# temporaries of the last two (see atomic_write).
_WRITTEN_HERE = re.compile(
    rf"{_OURS.pattern}|{re.escape(LOCK)}|\.?({re.escape(MARKER)}|{_STATE_FILE})"
    r"(\.\d+\.\w{8}\.tmp)?"
)
# What only towers writes: its marker (or the temporary of a save writing it now), its lock.
_TOWERS_ONLY = re.compile(rf"\.?{re.escape(MARKER)}(\.\d+\.\w{{8}}\.tmp)?|{re.escape(LOCK)}")
_WAIT_SECONDS = 60.0  # for another save of the same directory to finish


def write_checkpoint(directory: str, arrays: dict[str, np.ndarray]) -> None:
    """Writes a TensorFlow checkpoint into `directory`, committed by rewriting its state file.

    Each save writes a new uniquely named checkpoint, then atomically points the directory's
    "checkpoint" state file at it, then deletes the files of the checkpoints it replaced; a
    crash in between leaves the state file naming a complete checkpoint. Saves of one
    directory take turns (an OS lock), so two writers never delete each other's files.

    Raises:
      ValueError: if `directory` is a file or a TensorFlow checkpoint prefix, or a directory
        holding files `towers` did not write.
      RuntimeError: if another save keeps the directory for over a minute.
    """
    _claim(directory)
    lock = DirectoryLock(directory, LOCK, _WAIT_SECONDS, holder="another save_weights")
    try:
        _save(directory, arrays)
    finally:
        lock.release()


def _save(directory: str, arrays: dict[str, np.ndarray]) -> None:
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
    for name in os.listdir(directory):
        if name.startswith(prefix + "."):
            fsync_path(os.path.join(directory, name))
    state = f'model_checkpoint_path: "{prefix}"\nall_model_checkpoint_paths: "{prefix}"\n'
    atomic_write_text(os.path.join(directory, _STATE_FILE), state)
    for name in os.listdir(directory):
        if _OURS.fullmatch(name) and not name.startswith(prefix + "."):
            with contextlib.suppress(OSError):
                os.remove(os.path.join(directory, name))


def read_checkpoint(path: str) -> dict[str, np.ndarray]:
    """Every tensor of the checkpoint in directory `path`, or at prefix `path`.

    A save that replaces the directory's checkpoint while it is read (another process)
    deletes the files being read, or those its state file named a moment ago; the read then
    starts again from the new checkpoint (for up to a minute of such switches): a reader gets
    the old weights or the new ones, never an error for the switch. A checkpoint missing
    while the state file stays as it was is an error at once.
    """
    deadline = time.monotonic() + _WAIT_SECONDS
    directory = os.path.isdir(path)
    while True:
        state = _state_of(path) if directory else None
        prefix = tf.train.latest_checkpoint(path) if directory else path
        if prefix is None:
            if directory and _switched(path, state, deadline):
                continue
            raise FileNotFoundError(f"{path!r} is a directory without a TensorFlow checkpoint.")
        if directory and os.path.dirname(os.path.abspath(prefix)) != os.path.abspath(path):
            raise ValueError(  # its "checkpoint" file is untrusted: it may name any prefix
                f"The checkpoint state file of {path!r} names {prefix!r}, outside the "
                "directory; towers reads only checkpoints inside the directory it is given."
            )
        try:
            reader = tf.train.load_checkpoint(prefix)
            return {
                name: np.asarray(reader.get_tensor(name))
                for name in sorted(reader.get_variable_to_shape_map())
                if not name.startswith("_CHECKPOINTABLE_OBJECT_GRAPH")
            }
        except tf.errors.OpError:  # (a file deleted while read: not found, or a data loss)
            if not (directory and _switched(path, state, deadline)):
                raise


def _state_of(directory: str) -> bytes | None:
    """The directory's state file, as it is now (None: there is none)."""
    try:
        with open(os.path.join(directory, _STATE_FILE), "rb") as f:
            return f.read(1 << 16)  # towers writes two short lines
    except OSError:
        return None


def _switched(directory: str, state: bytes | None, deadline: float) -> bool:
    """Whether a save switched the state file since `state` was read (and time is left)."""
    return time.monotonic() < deadline and _state_of(directory) not in (None, state)


def _claim(directory: str) -> None:
    """Makes sure `directory` is towers' to write: new, empty, or written by towers."""
    if os.path.isfile(directory):
        raise ValueError(
            f"{directory!r} is a file; a path without suffix (or ending in .ckpt) names a "
            "TensorFlow checkpoint directory. Use a .npz or .h5 path to write a file."
        )
    if os.path.exists(directory + ".index"):
        raise ValueError(
            f"{directory!r} is the prefix of an existing TensorFlow checkpoint "
            f"({directory + '.index'!r}); a directory of that name would hide it. Choose "
            "another path."
        )
    os.makedirs(directory, exist_ok=True)
    entries = sorted(os.listdir(directory))
    foreign = [name for name in entries if not _WRITTEN_HERE.fullmatch(name)]
    if entries and not any(_OURS.fullmatch(n) or _TOWERS_ONLY.fullmatch(n) for n in entries):
        foreign = entries  # towers always writes weights files: these are someone else's
    if MARKER not in entries and foreign:
        shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
        raise ValueError(
            f"Cannot write weights into {directory!r}: it holds files towers did not write "
            f"({shown}), and towers never overwrites or deletes them. Save into a new or "
            "empty directory, or to a .npz or .h5 file."
        )
    if MARKER not in entries:
        marker = {"written_by": "towers.save_weights", "format": "TensorFlow checkpoint"}
        atomic_write_text(os.path.join(directory, MARKER), json.dumps(marker) + "\n")


def remove_checkpoint_dir(directory: str) -> None:
    """Removes what towers wrote in `directory`, and the directory if nothing else is left."""
    for name in os.listdir(directory):
        if _WRITTEN_HERE.fullmatch(name):
            with contextlib.suppress(OSError):
                os.remove(os.path.join(directory, name))
    with contextlib.suppress(OSError):
        os.rmdir(directory)


class TFCheckpoint(WeightsFormat):
    """A TensorFlow checkpoint directory (`tf.train.load_checkpoint` reads it); any dtype.

    Written only into a new or empty directory, or one `towers` wrote before; reads accept
    any checkpoint directory or prefix. Each tensor carries TensorFlow's own CRC-32C.
    """

    name = "checkpoint"
    suffixes = (".ckpt", "")
    description = "no suffix or .ckpt (a TensorFlow checkpoint directory)"

    def recognizes(self, path: str) -> bool:
        """See `WeightsFormat.recognizes`: a directory with a checkpoint, or a prefix."""
        if os.path.isdir(path):
            return tf.train.latest_checkpoint(path) is not None
        return os.path.exists(path + ".index")

    def check_dtypes(self, arrays: dict[str, np.ndarray]) -> None:
        """Every dtype: a TensorFlow checkpoint holds strings and booleans too."""
        del arrays

    def write(self, path: str, arrays: dict[str, np.ndarray]) -> None:
        """See `write_checkpoint`."""
        write_checkpoint(path, arrays)

    def read(self, path: str) -> dict[str, np.ndarray]:
        """See `read_checkpoint`."""
        return read_checkpoint(path)

    def whole(self, path: str) -> bool:
        """Whether the directory's "checkpoint" state file, written last, exists."""
        return os.path.exists(os.path.join(path, _STATE_FILE))

    def remove(self, path: str) -> None:
        """Removes what towers wrote in the directory (and it, if then empty)."""
        if os.path.isdir(path):
            remove_checkpoint_dir(path)
