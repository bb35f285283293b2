"""Whether each of many tensors is all finite, in a few kernels inside an XLA program.

The non-finite guard checks every gradient of a step. One `reduce_all(is_finite(t))` per
tensor is one kernel per tensor on a GPU: measured on the H200, the 78 checks of a GPT's
gradients took 1.1 ms as their own XLA program, more than the update they guard (0.5 ms),
although they read only 0.3 GB. Here tensors of one dtype and one shape whose size is a
whole number of blocks (most weights) are stacked and reduced together, one flag per row. The
others are flattened and padded with zeros to whole blocks, laid end to end (in chunks, so
that XLA fuses each chunk into one reduction: a fusion takes a bounded number of operands),
each block is reduced, and each tensor's verdict is the reduction of its (contiguous) range
of blocks' verdicts. A block never spans two tensors, so each tensor's flag is exact.

Outside XLA the layout would copy every tensor once more: there, one check per tensor.

Tensors that already lie end to end (a bucket of packed gradients) are checked where they
lie (`laid_flags`): the bucket's whole blocks are the rows of a reduction over the bucket
itself, with no concatenation for XLA to index through (on a CPU, such a reduction took a
fifth of the laid-out one's time over a GPT's gradients), and only the blocks that two
tensors share, or that a bucket ends in, are checked value by value.
"""

from collections.abc import Sequence

import numpy as np

from towers.ops._exact_widening import narrowest
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
    # A float32 tensor that widens a half-precision one is finite where that one is: half
    # the bytes to read, and the cast need not run (`narrow_form`).
    tensors = [narrowest(t) for t in tensors]
    if not laid_out:
        return tf.stack([tf.reduce_all(tf.math.is_finite(t)) for t in tensors])
    order, parts = [], []
    by_dtype: dict[tf.DType, list[int]] = {}
    for i, t in enumerate(tensors):
        by_dtype.setdefault(t.dtype, []).append(i)
    for positions in by_dtype.values():
        by_shape: dict[tuple | None, list[int]] = {}  # whole blocks: stacked, unpadded
        for i in positions:
            size = tensors[i].shape.num_elements()
            whole = size and size % BLOCK == 0
            by_shape.setdefault(tuple(tensors[i].shape) if whole else None, []).append(i)
        for shape, same in by_shape.items():
            for start in range(0, len(same), CHUNK):
                chunk = same[start : start + CHUNK]
                checked = [tensors[i] for i in chunk]
                parts.append(_chunk_flags(checked) if shape is None else _stacked_flags(checked))
                order += chunk
    flags = tf.concat(parts, 0) if len(parts) > 1 else parts[0]
    if order == sorted(order):
        return flags
    return tf.gather(flags, sorted(range(len(order)), key=order.__getitem__))  # back in order


def _stacked_flags(tensors: list[tf.Tensor]) -> tf.Tensor:
    """Flags of tensors of one dtype and one shape, a whole number of blocks each.

    Stacked, they are the rows of one reduction: a few operands of one shape, which XLA
    indexes through cheaply (on a CPU, a GPT's weights grouped so took a quarter of the
    time of the same weights laid end to end; grouped by size, mixing shapes, half).
    """
    rows = tf.stack(tensors) if len(tensors) > 1 else tensors[0][None]
    return tf.reduce_all(tf.math.is_finite(tf.reshape(rows, [len(tensors), -1, BLOCK])), [1, 2])


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

    Each bucket's whole blocks, and each value of its shared blocks, are compared with the
    range of every tensor of that bucket, every bucket padded to the largest counts: cheap
    for buckets of a few large tensors (a GPT's gradients in 64 MiB buckets: about 10 M
    pairs, a ResNet-50's about 20 M, in two fused reductions), quadratic in the tensors of
    a bucket of many small ones. Above `LAID_LIMIT`, check them one by one (`finite_flags`).
    """
    if not sizes:
        return 0
    whole = max(int(np.sum(counts)) // BLOCK for counts in sizes)
    shared = max(int((~_block_holders(counts)[1]).sum()) for counts in sizes)
    tensors = max(len(counts) for counts in sizes)
    return len(sizes) * (whole + shared * BLOCK) * tensors


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
    for flat, counts in zip(buckets, sizes):
        length, ends = int(flat.shape[0]), np.cumsum([0, *counts], dtype=np.int64)
        if ends[-1] != length:
            raise ValueError(f"Sizes {list(counts)} do not add up to the bucket's {length}.")
        ranges.append(ends)
        whole = length // BLOCK
        holder, inside = _block_holders(counts)
        owners.append(np.where(inside, holder, -1)[:whole])
        shared = np.flatnonzero(~inside)  # the blocks not inside one tensor
        bases.append(shared * BLOCK)
        ok.append(None)
        rows = []
        if whole:
            blocks = tf.reshape(flat[: whole * BLOCK], [whole, BLOCK])
            ok[-1] = tf.reduce_all(tf.math.is_finite(blocks), axis=1)
            if shared.size and shared[0] < whole:
                rows.append(tf.gather(blocks, shared[shared < whole]))
        if length % BLOCK:  # the last part block, zeros after it
            tail = flat[whole * BLOCK :]
            padded = tf.concat([tail, tf.zeros([BLOCK - length % BLOCK], flat.dtype)], 0)
            rows.append(tf.reshape(padded, [1, BLOCK]))
        edges.append([tf.math.is_finite(r) for r in rows])
    tensors = max((len(counts) for counts in sizes), default=0)
    if not tensors:
        return [tf.zeros([0], tf.bool) for _ in buckets]
    # Every bucket padded to the largest counts (blocks, shared blocks, tensors), so that
    # each comparison is with its own bucket's tensors: one fused reduction for all.
    bad = tf.zeros([len(buckets), tensors], tf.bool)
    whole = max(len(owner) for owner in owners)
    if whole:  # a whole block inside a tensor that holds a NaN or Inf
        owner = np.full([len(buckets), whole], -1, np.int32)
        finite = []
        for i, (block_ok, block_owner) in enumerate(zip(ok, owners)):
            owner[i, : len(block_owner)] = block_owner
            pad = tf.ones([whole - len(block_owner)], tf.bool)
            finite.append(pad if block_ok is None else tf.concat([block_ok, pad], 0))
        spoiled = tf.logical_not(tf.stack(finite))[:, :, None]
        mine = tf.equal(tf.constant(owner)[:, :, None], tf.range(tensors)[None, None, :])
        bad = tf.reduce_any(tf.logical_and(spoiled, mine), axis=1)
    shared = max(len(b) for b in bases)
    if shared:  # a value of the tensor in a shared block
        first = np.zeros([len(buckets), tensors], np.int64)  # (padding: owns nothing)
        last = np.zeros([len(buckets), tensors], np.int64)
        at = np.zeros([len(buckets), shared], np.int64)
        finite = []
        for i, (ends, base, rows) in enumerate(zip(ranges, bases, edges)):
            first[i, : len(ends) - 1], last[i, : len(ends) - 1] = ends[:-1], ends[1:]
            at[i, : len(base)] = base
            rows = rows + [tf.ones([shared - len(base), BLOCK], tf.bool)]
            finite.append(tf.concat(rows, 0))
        values = tf.logical_not(tf.stack(finite))[:, :, :, None]
        where = tf.constant(at)[:, :, None, None] + tf.range(BLOCK, dtype=tf.int64)[:, None]
        mine = tf.logical_and(
            where >= tf.constant(first)[:, None, None, :],
            where < tf.constant(last)[:, None, None, :],
        )
        bad = tf.logical_or(bad, tf.reduce_any(tf.logical_and(values, mine), axis=[1, 2]))
    flags = tf.logical_not(bad)
    return [flags[i, : len(counts)] for i, counts in enumerate(sizes)]
