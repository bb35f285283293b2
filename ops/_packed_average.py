"""The weighted mean of dense tower gradients, sent to each variable device in packed buckets."""

from towers.ops._device_scope import device_scope
from towers.ops._packing import pack, pack_spec, unpack
from towers.ops._tensorflow import tf
from towers.ops._weighted_mean import Weight, accumulation_dtype, equal_weights


def packed_mean(
    per_tower: list[list[tf.Tensor]], weights: list[Weight], device: str, bucket_bytes: int
) -> list[tf.Tensor]:
    """The weighted mean of K towers' dense gradients of N variables living on `device`.

    Each tower packs its N gradients into buckets of at most `bucket_bytes` on its own
    device (scaled by its weight there when weights differ), so a few buffers per tower
    cross to `device` instead of N; `device` adds the K buckets, multiplies once when
    weights are equal, and unpacks. Elementwise the same operations as averaging gradient by
    gradient (sums in float32 for half precision); the results agree to the last bit or so
    (TensorFlow's AddN may round differently at other offsets of a buffer).

    Args:
      per_tower: K lists of N dense gradients with static shapes, list i on tower i.
      weights: K normalized weights.
      device: Where the N variables live.
      bucket_bytes: The largest bucket.

    Returns:
      N averaged gradients, built on `device`, in the gradients' dtypes.
    """
    wide = [accumulation_dtype(g.dtype) for g in per_tower[0]]
    equal = equal_weights(weights)
    packed = []
    for grads, weight in zip(per_tower, weights):
        with device_scope(grads[0].device):
            cast = [tf.cast(g, d) for g, d in zip(grads, wide)]
            if not packed:
                spec = pack_spec(cast, bucket_bytes)
            buckets = pack(cast, spec)
            packed.append(buckets if equal else [b * tf.cast(weight, b.dtype) for b in buckets])
    with device_scope(device):
        sums = [tf.add_n(list(bucket)) for bucket in zip(*packed)]
        if equal:
            sums = [s * tf.cast(weights[0], s.dtype) for s in sums]
        return [tf.cast(g, t.dtype) for g, t in zip(unpack(sums, spec), per_tower[0])]
