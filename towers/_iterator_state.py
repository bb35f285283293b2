"""The position of a `tf.data` iterator as bytes, for checkpoints (TensorFlow's own encoding)."""

from typing import Any

import numpy as np

from towers.ops._tensorflow import tf

# The state file member of an iterator kept under `extra={key: iterator}`: "extra/<key>/<this>".
MEMBER = "iterator_state"


def is_iterator(obj: Any) -> bool:
    """Whether `obj` is a `tf.data` iterator (`iter(dataset)`)."""
    return isinstance(obj, tf.data.Iterator)


def iterator_state(iterator: Any) -> np.ndarray:
    """The iterator's position (and buffered elements, e.g. a shuffle buffer) as uint8 bytes.

    Raises:
      ValueError: if TensorFlow cannot save it (an iterator over external state, such as a
        `Dataset.from_generator`).
    """
    try:
        (state,) = iterator._serialize_to_tensors().values()  # the Trackable saving protocol
        encoded = tf.io.serialize_tensor(state).numpy()
    except (tf.errors.OpError, ValueError) as error:
        raise ValueError(
            f"The input pipeline's position cannot be saved: {error}. Pipelines built from "
            "Python generators or other external state cannot be checkpointed; build the "
            "dataset from tensors or files."
        ) from None
    return np.frombuffer(encoded, np.uint8)


def restore_iterator(iterator: Any, state: np.ndarray, key: str) -> None:
    """Moves `iterator` to the position `iterator_state` saved.

    Raises:
      ValueError: if the state does not fit the iterator's pipeline.
    """
    try:
        encoded = tf.io.parse_tensor(np.asarray(state, np.uint8).tobytes(), tf.variant)
        (name,) = iterator._serialize_to_tensors().keys()
        iterator._restore_from_tensors({name: encoded})
    except (tf.errors.OpError, ValueError) as error:
        raise ValueError(
            f"The saved input position {key!r} does not fit this input pipeline: {error}. "
            "Build the same dataset (same transformations, seeds and batch size) as the run "
            "that saved it."
        ) from None
