"""The weighted mean of dense tower gradients, sent to each variable device in packed buckets."""

import collections

from towers.ops._device_scope import device_scope
from towers.ops._exact_widening import narrow_columns
from towers.ops._packing import PackSpec, pack, pack_spec, unpack
from towers.ops._tensorflow import tf
from towers.ops._weighted_mean import Weight, weighted_sum


def packed_mean(
    per_tower: list[list[tf.Tensor]], weights: list[Weight], device: str, bucket_bytes: int
) -> list[tf.Tensor]:
    """The weighted mean of K towers' dense gradients of N variables living on `device`.

    Each tower packs its N gradients, as they are (half precision stays half, and so do, from
    two towers, float32 gradients that are exactly half-precision ones:
    `towers.ops._exact_widening`), into buckets of at most `bucket_bytes` on its own device,
    so a few buffers per tower cross to `device` instead of N. `device` widens them (float32
    for half precision), weights them (once per bucket when weights are equal, per tower
    otherwise), adds them and unpacks: elementwise the operations of averaging gradient by
    gradient; the results agree to the last bit or so (TensorFlow's AddN may round
    differently at other offsets of a buffer).

    Args:
      per_tower: K lists of N dense gradients with static shapes, list i on tower i.
      weights: K normalized weights.
      device: Where the N variables live.
      bucket_bytes: The largest bucket.

    Returns:
      N averaged gradients, built on `device`, in the gradients' dtypes.
    """
    dtypes = [g.dtype for g in per_tower[0]]
    if len(per_tower) == 2:  # exact float32 gradients of half-precision ones cross narrow
        columns = narrow_columns([list(column) for column in zip(*per_tower)])
        per_tower = [[column[i] for column in columns] for i in range(2)]
    sent = [g.dtype for g in per_tower[0]]
    spec = pack_spec(per_tower[0], bucket_bytes)
    # A gradient alone in its bucket crosses as it is: packing it would add two reshapes.
    shared = PackSpec(tuple(b for b in spec.buckets if len(b) > 1), spec.shapes)
    alone = [b[0] for b in spec.buckets if len(b) == 1]
    packed = []
    for grads in per_tower:
        with device_scope(_tower_device(grads) or device):  # on the tower, when it says where
            same = [tf.cast(g, d) for g, d in zip(grads, sent)]  # (no op when they agree)
            packed.append(pack(same, shared) if shared.buckets else [])
    with device_scope(device):
        sums = [weighted_sum(b, weights, wide=True) for b in zip(*packed)]
        out = unpack(sums, shared)
        for j in alone:
            out[j] = weighted_sum([grads[j] for grads in per_tower], weights, wide=True)
        return [tf.cast(g, d) for g, d in zip(out, dtypes)]


def _tower_device(grads: list[tf.Tensor]) -> str:
    """Where most of a tower's gradients are (a custom gradient may sit elsewhere); "" if none."""
    named = collections.Counter(g.device for g in grads if g.device)
    return named.most_common(1)[0][0] if named else ""
