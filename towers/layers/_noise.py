"""Randomness per example, the same however the batch is split: `dropout` and its noise.

Each element's draw is a function of the seed and of its position in the step's global
batch only (TensorFlow's stateless Philox generator, started at the element's counter): a
tower, a micro-batch or one device on the whole batch draw the same numbers for the same
example, so a model with dropout keeps the promise of equal steps.
"""

from typing import Any

import tensorflow as tf

from towers.core import first_example
from towers.ops.internal import check_number, host_scope, library_code

_PER_BLOCK = 4  # float32 draws per Philox counter step
_PHILOX = 1  # tf.random.Algorithm.PHILOX


@library_code
def example_uniform(x: tf.Tensor, seed: Any) -> tf.Tensor:
    """Uniform float32 noise in [0, 1) of `x`'s shape, drawn per example.

    The draw of element `[i, ...]` depends only on `seed` and on the global index of
    example i in the step's batch (its tower's first example plus i): splitting the batch
    over towers or micro-batches changes none. Fold the step into the seed for new noise
    every step.

    Args:
      x: A tensor whose first axis is the batch.
      seed: A shape [2] integer tensor (or pair), e.g. `[1234, step]`.

    Returns:
      A float32 tensor of `x`'s shape.

    Raises:
      ValueError: if `x` is a scalar or `seed` is not of shape [2].
    """
    x = tf.convert_to_tensor(x)
    seed = tf.convert_to_tensor(seed)
    if x.shape.rank == 0:
        raise ValueError("`x` must have a batch axis; got a scalar.")
    if not seed.dtype.is_integer or not seed.shape.is_compatible_with([2]):
        raise ValueError(
            f"`seed` must be two integers (shape [2]); got {seed.dtype.name}{seed.shape}."
        )
    shape = tf.shape(x, out_type=tf.int64)
    row = tf.reduce_prod(shape[1:])
    with host_scope():  # key and counter: a few scalars
        key, counter = tf.raw_ops.StatelessRandomGetKeyCounter(seed=tf.cast(seed, tf.int64))
        start = tf.cast(first_example(), tf.int64) * row  # this shard's first element
        block, skip = start // _PER_BLOCK, start % _PER_BLOCK
        # Counting from 0 in the low word: the element's counter never carries over.
        counter = tf.stack([tf.cast(block, tf.uint64), counter[1]])
    flat = tf.raw_ops.StatelessRandomUniformV2(
        shape=tf.reshape(shape[0] * row + skip, [1]),
        key=key,
        counter=counter,
        alg=_PHILOX,
        dtype=tf.float32,
    )
    return tf.reshape(flat[skip:], shape)


@library_code
def dropout(x: tf.Tensor, rate: float, seed: Any) -> tf.Tensor:
    """`tf.nn.dropout` with a mask drawn per example (`towers.example_uniform`).

    Each element is kept with probability 1 - `rate` and scaled by 1 / (1 - rate); which
    elements are kept depends on `seed` and the example's position in the global batch
    only, so K towers drop what one device would on the whole batch.

    Args:
      x: A floating tensor whose first axis is the batch.
      rate: The probability of dropping an element, in [0, 1).
      seed: A shape [2] integer tensor, e.g. `[1234, step]` (a new mask each step).

    Returns:
      A tensor of `x`'s shape and dtype.

    Raises:
      ValueError: if `rate` is not in [0, 1), or as `example_uniform`.
      TypeError: if `x` is not floating or `rate` not a number.
    """
    rate = check_number(rate, "rate", minimum=0.0, below=1.0)
    x = tf.convert_to_tensor(x)
    if not x.dtype.is_floating:
        raise TypeError(f"`x` must be floating; got {x.dtype.name}.")
    if rate == 0.0:
        return x
    keep = example_uniform(x, seed) >= rate
    scale = tf.constant(1.0 / (1.0 - rate), x.dtype)
    return tf.where(keep, x * scale, tf.zeros_like(x))
