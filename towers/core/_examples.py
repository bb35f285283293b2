"""Where the examples being built sit in the step's global batch: the first one's index.

`replicate` gives tower i the index of its shard's first example (the sizes of the shards
before it), micro-batches add their part's. Randomness per example (`towers.dropout`)
reads it, so that an example's noise does not depend on how the batch was split.
"""

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import tensorflow as tf

from towers.ops.internal import library_code

_local = threading.local()  # graphs are built per thread


@library_code
def first_example() -> Any:
    """The global index of the first example being built: 0 outside towers.

    Returns:
      An int when every size before it is static, else a scalar int64 tensor.
    """
    total: Any = 0
    for before in getattr(_local, "offsets", ()):
        for size in before() if callable(before) else before:
            if isinstance(total, int) and isinstance(size, int):
                total += size
            else:
                total = tf.cast(total, tf.int64) + tf.cast(size, tf.int64)
    return total


@contextlib.contextmanager
def examples_from(before: Sequence[Any] | Callable[[], Sequence[Any]]) -> Iterator[None]:
    """Within: the examples being built come after `before` more examples than the enclosing.

    Args:
      before: The sizes (ints or scalar integer tensors) of the parts before these, or a
        callable giving them when they are needed (computed only where something reads it).
    """
    offsets = _local.__dict__.setdefault("offsets", [])
    offsets.append(before)
    try:
        yield
    finally:
        offsets.pop()
