"""The position of a `tf.data` iterator as bytes, for checkpoints (TensorFlow's own encoding).

TensorFlow's iterator state holds the pipeline itself (the dataset's graph) with the position:
restored, the iterator continues the saved pipeline, whatever the new one was built from. So
the state file also keeps the elements' structure, dtypes and static shapes, and a pipeline
whose elements differ from the saved one's is refused rather than silently replaced.
"""

from typing import Any

import numpy as np
import tensorflow as tf

# The state file members of an iterator kept under `extra={key: iterator}`: "extra/<key>/<this>".
MEMBER = "iterator_state"
SPEC_MEMBER = "iterator_element_spec"


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


def element_spec(iterator: Any) -> np.ndarray:
    """What the iterator's elements are (structure, dtypes, static shapes) as uint8 bytes."""
    return np.frombuffer(repr(iterator.element_spec).encode(), np.uint8)


def check_element_spec(iterator: Any, saved: np.ndarray | None, key: str) -> None:
    """Refuses a pipeline whose elements differ from those of the pipeline saved.

    Raises:
      ValueError: naming both.
    """
    if saved is None:
        return
    mine, theirs = element_spec(iterator).tobytes().decode(), saved.tobytes().decode()
    if mine != theirs:
        raise ValueError(
            f"The input position saved as extra[{key!r}] belongs to a pipeline of other "
            f"elements: saved {theirs}, this one {mine}. Resume with the dataset the run was "
            "saved with (TensorFlow restores that pipeline itself), or pass strict=False and "
            "leave this iterator out of `extra`."
        )


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
