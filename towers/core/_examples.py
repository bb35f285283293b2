"""Where the examples being built sit in the step's global batch: the first one's index.

`replicate` gives tower i the index of its shard's first example (the sizes of the shards
before it), micro-batches add their part's. Randomness per example (`towers.dropout`)
reads it, so that an example's noise does not depend on how the batch was split.
"""

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import tensorflow as tf

from towers.ops.internal import library_code

_local = threading.local()  # graphs are built per thread


@library_code
def first_example() -> Any:
    """The global index of the first example being built: 0 outside towers.

    Returns:
      An int when every offset is static, else a scalar int64 tensor.
    """
    total: Any = 0
    for offset in getattr(_local, "offsets", ()):
        offset = offset() if callable(offset) else offset
        if isinstance(total, int) and isinstance(offset, int):
            total += offset
        else:
            total = tf.cast(total, tf.int64) + tf.cast(offset, tf.int64)
    return total


@contextlib.contextmanager
def examples_from(offset: int | tf.Tensor | Callable[[], Any]) -> Iterator[None]:
    """Within: the examples being built start `offset` examples after the enclosing ones.

    Args:
      offset: An int, a scalar integer tensor, or a callable giving one when it is needed
        (computed only where something reads it).
    """
    offsets = _local.__dict__.setdefault("offsets", [])
    offsets.append(offset)
    try:
        yield
    finally:
        offsets.pop()
