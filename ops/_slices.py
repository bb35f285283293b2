"""`tf.IndexedSlices` helpers: summing duplicate rows, making the gradient dense."""

from towers.ops._tensorflow import tf


def deduplicated(grad: tf.IndexedSlices) -> tf.IndexedSlices:
    """The same slices with each row once (duplicate rows summed)."""
    unique, positions = tf.unique(grad.indices)
    values = tf.math.unsorted_segment_sum(grad.values, positions, tf.shape(unique)[0])
    return tf.IndexedSlices(values, unique, grad.dense_shape)


def densified(grad: tf.IndexedSlices, like: tf.Variable | tf.Tensor) -> tf.Tensor:
    """The dense gradient, shaped like `like` (its variable, or a dense gradient of it).

    Duplicate rows add up.
    """
    rows = tf.shape(like, out_type=grad.indices.dtype)[0]
    dense = tf.math.unsorted_segment_sum(grad.values, grad.indices, rows)
    dense.set_shape(like.shape)
    return dense
