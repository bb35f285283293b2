"""Scalar summaries written once per step, tagged by name, never by tower."""

from typing import Any

import tensorflow as tf

from towers.core import current_tower
from towers.ops.internal import library_code


def _scalar_metadata() -> bytes:
    """What marks a summary as a scalar for TensorBoard (its "scalars" plugin)."""
    metadata = tf.compat.v1.SummaryMetadata()
    metadata.plugin_data.plugin_name = "scalars"
    return metadata.SerializeToString()


_SCALARS = _scalar_metadata()


@library_code
def summary_scalar(name: str, value: Any, step: Any = None) -> Any:
    """Writes a scalar to the default summary writer, once per step, tagged `name` exactly.

    `tf.summary.scalar` prefixes the current name scope, so a scalar written inside tower 3
    becomes "tower_3/loss", K times per step. Here the tag is `name`, whatever the scopes;
    inside towers only the first tower writes (pass a value of the whole batch, such as the
    loss `train_step` returns, from outside the towers to log the whole batch). TensorBoard
    shows it as a scalar; writing needs no TensorBoard (`tf.summary.write`), reading does
    (`pip install 'tf-towers[tensorboard]'`).

    Args:
      name: The tag, e.g. "train/loss".
      value: A real scalar (a number or a tensor).
      step: The step; default `tf.summary.experimental.get_step()`.

    Returns:
      Whether it was written (a boolean tensor, or False without a default writer, or in a
      tower after the first).

    Raises:
      TypeError: if `name` is not a non-empty string.
      ValueError: if `value` is not a scalar.

    Example:
      >>> with tf.summary.create_file_writer(logdir).as_default(step=step_var):
      ...     loss, _ = towers.train_step(...)
      ...     towers.summary_scalar("train/loss", loss)
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"`name` must be a non-empty string; got {name!r}.")
    value = tf.cast(value, tf.float32)
    if value.shape.rank not in (None, 0):
        raise ValueError(
            f"`value` must be a scalar; got shape {value.shape} for {name!r}. Reduce it first "
            "(e.g. tf.reduce_mean)."
        )
    tower = current_tower()
    if tower is not None and not tower.is_chief:
        return tf.constant(False)
    with tf.device("/cpu:0"):
        return tf.summary.write(name, value, step=step, metadata=_SCALARS)
