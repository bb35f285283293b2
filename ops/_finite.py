"""Whether each of many tensors is all finite, in a few kernels inside an XLA program.

The non-finite guard checks every gradient of a step. One `reduce_all(is_finite(t))` per
tensor is one kernel per tensor on a GPU: measured on the H200, the 78 checks of a GPT's
gradients took 1.1 ms as their own XLA program, more than the update they guard (0.5 ms),
although they read only 0.3 GB. Here each tensor is flattened and padded with zeros to whole
blocks, the tensors of a dtype are laid end to end (in chunks, so that XLA fuses each chunk
into one reduction: a fusion takes a bounded number of operands), each block is reduced, and
each tensor's verdict is the reduction of its (contiguous) range of blocks' verdicts. A block never
spans two tensors, so each tensor's flag is exact.

Outside XLA the layout would copy every tensor once more: there, one check per tensor.

Tensors that already lie end to end (a bucket of packed gradients) are checked where they
lie (`laid_flags`): the bucket's whole blocks are the rows of a reduction over the bucket
itself, with no concatenation for XLA to index through (on a CPU, such a reduction took a
fifth of the laid-out one's time over a GPT's gradients), and only the blocks that two
tensors share, or that a bucket ends in, are checked value by value.
"""

from collections.abc import Sequence

import numpy as np

from towers.ops._tensorflow import tf

BLOCK = 2048  # values per block: long rows for the reduction, little padding per tensor
CHUNK = 32  # tensors per fused reduction


def finite_flags(tensors: Sequence[tf.Tensor], *, laid_out: bool = True) -> tf.Tensor:
    """A boolean vector: for each tensor, whether all its values are finite.

    Args:
      tensors: Floating-point tensors of static shapes (with `laid_out`), any dtypes.
      laid_out: Check them laid end to end in blocks (for inside an XLA program); False:
        one reduction per tensor (for TensorFlow's executor).

    Returns:
      A boolean vector, one flag per tensor, in order.
    """
    if not tensors:
        return tf.zeros([0], tf.bool)
    if not laid_out:
        return tf.stack([tf.reduce_all(tf.math.is_finite(t)) for t in tensors])
    order, parts = [], []
    by_dtype: dict[tf.DType, list[int]] = {}
    for i, t in enumerate(tensors):
        by_dtype.setdefault(t.dtype, []).append(i)
    for positions in by_dtype.values():
        for start in range(0, len(positions), CHUNK):
            chunk = positions[start : start + CHUNK]
            parts.append(_chunk_flags([tensors[i] for i in chunk]))
            order += chunk
    flags = tf.concat(parts, 0) if len(parts) > 1 else parts[0]
    if order == sorted(order):
        return flags
    return tf.gather(flags, sorted(range(len(order)), key=order.__getitem__))  # back in order


def _chunk_flags(tensors: list[tf.Tensor]) -> tf.Tensor:
    """Flags of tensors of one dtype: their blocks reduced, then each tensor's range of them.

    A tensor's blocks are a contiguous range; a column reduction over a (blocks x tensors)
    mask of the ranges gives each tensor's verdict in one kernel (a segment reduction would
    scatter: atomics into a few addresses, 0.5 ms on the H200 for a GPT's gradients).
    """
    pieces, starts, ends = [], [], []
    for t in tensors:
        flat = tf.reshape(t, [-1])
        size = int(flat.shape[0])
        blocks = -(-size // BLOCK)
        starts.append(ends[-1] if ends else 0)
        ends.append(starts[-1] + blocks)
        if blocks:  # zeros after it (not `tf.pad`: XLA makes each pad a kernel of its own)
            pieces.append(flat)
            if size % BLOCK:
                pieces.append(tf.zeros([blocks * BLOCK - size], t.dtype))
    if not pieces:  # every tensor empty: all finite
        return tf.ones([len(tensors)], tf.bool)
    rows = tf.reshape(tf.concat(pieces, 0) if len(pieces) > 1 else pieces[0], [-1, BLOCK])
    bad = tf.logical_not(tf.reduce_all(tf.math.is_finite(rows), axis=1))  # per block
    block = tf.range(ends[-1])[:, None]
    owned = tf.logical_and(block >= tf.constant(starts), block < tf.constant(ends))
    # (An empty tensor owns no block: finite.)
    return tf.logical_not(tf.reduce_any(tf.logical_and(owned, bad[:, None]), axis=0))


LAID_LIMIT = 2**27  # the most (value or block) x tensor pairs `laid_flags` compares


def laid_pairs(sizes: Sequence[Sequence[int]]) -> int:
    """How many (value or block, tensor) pairs `laid_flags` compares for buckets of `sizes`.

    Each value of a shared block, and each whole block, is compared with every tensor's
    range: cheap for a few large tensors (a GPT's 80 gradients: about 10 M pairs, a
    ResNet-50's 161 about 21 M, in two fused reductions), quadratic in the tensors for many
    small ones. Above `LAID_LIMIT`, check the tensors one by one (`finite_flags`) instead.
    """
    tensors = sum(len(counts) for counts in sizes)
    blocks = shared = 0
    for counts in sizes:
        _, inside = _block_holders(counts)
        blocks += int(np.sum(counts)) // BLOCK
        shared += int((~inside).sum())
    return (blocks + shared * BLOCK) * tensors


def _block_holders(counts: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Per block of a bucket of tensors of sizes `counts`: the tensor it starts in, inside it.

    Returns:
      `(holder, inside)`: the index of the tensor each block starts in, and whether the
      block is a whole block that lies inside that tensor.
    """
    ends = np.cumsum([0, *counts])
    length = int(ends[-1])
    starts = np.arange(-(-length // BLOCK)) * BLOCK
    holder = np.searchsorted(ends, starts, side="right") - 1
    inside = (starts + BLOCK <= ends[np.minimum(holder + 1, len(counts))]) & (
        starts + BLOCK <= length // BLOCK * BLOCK
    )
    return holder, inside


def laid_flags(buckets: Sequence[tf.Tensor], sizes: Sequence[Sequence[int]]) -> list[tf.Tensor]:
    """For tensors laid end to end in flat buckets, each tensor's all-finite flag.

    Each bucket is read where it lies: its whole blocks as the rows of one reduction (one
    flag per block), a block inside one tensor then counting for that tensor. The blocks
    that hold parts of two tensors, or a bucket's last part block, are gathered (a few
    small rows) and checked value by value against each tensor's range. So each flag is
    exact: a value decides its own tensor's flag and no other's.

    Args:
      buckets: 1-D floating-point tensors of static lengths (any dtypes).
      sizes: For each bucket, the sizes of the tensors laid in it, in order; they add up
        to the bucket's length.

    Returns:
      For each bucket, a boolean vector: each of its tensors' flag, in order.

    Its work grows with the tensors times the values of shared blocks (`laid_pairs`).
    """
    ok, owners, edges, bases, ranges = [], [], [], [], []
    offset = 0  # where each bucket's blocks begin, in one numbering for every bucket
    for flat, counts in zip(buckets, sizes):
        length, ends = int(flat.shape[0]), np.cumsum([0, *counts])
        if ends[-1] != length:
            raise ValueError(f"Sizes {list(counts)} do not add up to the bucket's {length}.")
        member = len(ranges)
        ranges += [(offset + a, offset + b) for a, b in zip(ends[:-1], ends[1:])]
        whole = length // BLOCK
        holder, inside = _block_holders(counts)
        owner = np.where(inside, member + holder, -1)[:whole].astype(np.int32)
        shared = np.flatnonzero(~inside).tolist()  # the blocks not inside one tensor
        if whole:
            rows = tf.reshape(flat[: whole * BLOCK], [whole, BLOCK])
            ok.append(tf.reduce_all(tf.math.is_finite(rows), axis=1))
            owners.append(owner)
        parts = [k for k in shared if k < whole]
        if parts:
            edges.append(tf.math.is_finite(tf.gather(rows, parts)))
        if length % BLOCK:  # the last part block, zeros after it
            tail = flat[whole * BLOCK :]
            padded = tf.concat([tail, tf.zeros([BLOCK - length % BLOCK], flat.dtype)], 0)
            edges.append(tf.math.is_finite(tf.reshape(padded, [1, BLOCK])))
        bases += [offset + k * BLOCK for k in shared]
        offset += -(-length // BLOCK) * BLOCK
    if not ranges:
        return [tf.zeros([0], tf.bool) for _ in buckets]
    first = tf.constant([a for a, _ in ranges], tf.int64)
    last = tf.constant([b for _, b in ranges], tf.int64)
    bad = tf.zeros([len(ranges)], tf.bool)
    if ok:  # a whole block inside a tensor that holds a NaN or Inf
        owner = tf.constant(np.concatenate(owners))[:, None]
        blocks = tf.logical_not(tf.concat(ok, 0) if len(ok) > 1 else ok[0])[:, None]
        mine = tf.equal(owner, tf.range(len(ranges), dtype=tf.int32)[None, :])
        bad = tf.reduce_any(tf.logical_and(blocks, mine), axis=0)
    if edges:  # a value of the tensor in a shared block
        values = tf.logical_not(tf.concat(edges, 0) if len(edges) > 1 else edges[0])
        at = tf.constant(bases, tf.int64)[:, None] + tf.range(BLOCK, dtype=tf.int64)[None, :]
        at = tf.reshape(at, [-1, 1])
        mine = tf.logical_and(at >= first[None, :], at < last[None, :])
        hit = tf.logical_and(tf.reshape(values, [-1, 1]), mine)
        bad = tf.logical_or(bad, tf.reduce_any(hit, axis=0))
    flags = tf.logical_not(bad)
    out, start = [], 0
    for counts in sizes:
        out.append(flags[start : start + len(counts)])
        start += len(counts)
    return out
