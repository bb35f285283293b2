"""Tower gradients' `tf.IndexedSlices` gathered, with each row once, onto their devices."""

from towers.ops._slices import deduplicated
from towers.ops._tensorflow import tf
from towers.ops._weighted_mean import scale


def gathered_slices(column: list, devices: list, weights: list) -> list[tf.IndexedSlices]:
    """Every tower's scaled slices, gathered once with each row once, copied to each device.

    The repeated rows are summed on the first device only: GPU kernels that add repeated rows
    (`unsorted_segment_sum`, scatters) add them in a run-dependent order, so devices summing
    them each would leave the replicated copies apart by an ulp. Rows arriving unique make
    every later use (the dense gradient, a scatter, the hook's rows) the same on every device.
    """
    gathered = slices_on(devices[0], column, devices, weights)
    out = []
    for device in devices:
        with tf.device(device):
            values, indices = tf.identity(gathered.values), tf.identity(gathered.indices)
            out.append(tf.IndexedSlices(values, indices, gathered.dense_shape))
    return out


def slices_on(device: str, column: list, devices: list, weights: list) -> tf.IndexedSlices:
    """Every tower's slices, scaled by its weight, gathered on `device` with each row once."""
    scaled = []
    for grad, source, weight in zip(column, devices, weights):
        with tf.device(source):
            scaled.append((scale(grad.values, weight), grad.indices))
    with tf.device(device):
        values = tf.concat([tf.identity(v) for v, _ in scaled], axis=0)
        indices = tf.concat([tf.identity(i) for _, i in scaled], axis=0)
        return deduplicated(tf.IndexedSlices(values, indices, column[0].dense_shape))
