"""The all-reduce's two halves: reduce-scatter (each device its part of the sum) and all-gather.

Values of shape [N, ...] are cut along their first axis into one part per device of the group
(`sizes`, in the group's order: this process's devices from `AllReduce.group_rank` on). A
reduce-scatter leaves part i of the sum on device i; an all-gather puts every device's part
together, in order, on every device. One after the other they are the all-reduce (a ring
all-reduce is exactly that), and sharded optimizer state is built on them: each device
updates its part, then every device gathers the parts.

Every algorithm has both: by default through its `sum` (the whole sum, of which each device
keeps its part; each part padded with zeros to the whole and summed, which adds it exactly),
and faster where an algorithm overrides `scatter_sum` and `gather_parts`.
"""

from collections.abc import Sequence

from towers.ops._arguments import check_int
from towers.ops._split import shard_sizes
from towers.ops._tensorflow import tf


def checked_sizes(
    sizes: Sequence[int] | None, total: int | None, group: int, what: str
) -> list[int]:
    """`sizes` as `group` ints >= 0 summing to `total` (default: as even as `split_batch`).

    With `total` None (an all-gather's), any sum: the sizes are the parts' own.

    Raises:
      ValueError, TypeError: naming `sizes`, the value received and what they must sum to.
    """
    if sizes is None:
        return (
            [int(n) for n in shard_sizes(total, group)] if total >= group else _spread(total, group)
        )
    sizes = [check_int(n, "sizes", minimum=0) for n in sizes]
    if len(sizes) != group or (total is not None and sum(sizes) != total):
        raise ValueError(
            f"`sizes` must be {group} ints (one per device of the group)"
            + ("" if total is None else f" summing to the {what}, {total}")
            + f"; got {sizes}."
        )
    return sizes


def _spread(total: int, group: int) -> list[int]:
    """Fewer rows than devices: one row to each of the first devices, none to the rest."""
    return [1] * total + [0] * (group - total)


def starts(sizes: list[int]) -> list[int]:
    """Where each part begins along the first axis."""
    out, at = [], 0
    for size in sizes:
        out.append(at)
        at += size
    return out


def first_dimension(values: list[tf.Tensor], what: str) -> int:
    """The values' static first dimension (they agree: the contract's checks ran).

    Raises:
      ValueError: if the values are scalars or their first dimension is not static.
    """
    shape = values[0].shape
    if shape.rank is None or shape.rank == 0 or shape[0] is None:
        raise ValueError(
            f"{what} cuts values along their first axis, which must be static; got shape {shape}."
        )
    return int(shape[0])


def sliced(values: list[tf.Tensor], devices: list[str], sizes: list[int], rank: int) -> list:
    """From `values[i]` (on `devices[i]`) the part of the group's device `rank + i`."""
    begin = starts(sizes)
    out = []
    for i, (value, device) in enumerate(zip(values, devices)):
        with tf.device(device):
            out.append(value[begin[rank + i] : begin[rank + i] + sizes[rank + i]])
    return out


def part_of(values: list[tf.Tensor], devices: list[str], sizes: list[int], part: int) -> list:
    """Part `part` (of the group's parts) of every value, each sliced on its own device."""
    begin = starts(sizes)[part]
    out = []
    for value, device in zip(values, devices):
        with tf.device(device):
            out.append(value[begin : begin + sizes[part]])
    return out


def padded(parts: list[tf.Tensor], devices: list[str], sizes: list[int], rank: int) -> list:
    """Each part in its place of a whole of zeros (on its device), to be summed."""
    begin, total = starts(sizes), sum(sizes)
    out = []
    for i, (part, device) in enumerate(zip(parts, devices)):
        before = begin[rank + i]
        after = total - before - sizes[rank + i]
        with tf.device(device):  # zeros concatenated around it (a GPU has no int64 Pad)
            rest = tf.shape(part)[1:]
            zeros = [tf.zeros(tf.concat([[n], rest], 0), part.dtype) for n in (before, after)]
            out.append(tf.concat([zeros[0], part, zeros[1]], axis=0))
    return out


def concatenated(parts: list[tf.Tensor], devices: list[str]) -> list[tf.Tensor]:
    """Every part, in order, concatenated on each device: the same bits everywhere."""
    out = []
    for device in devices:
        with tf.device(device):
            out.append(tf.concat([tf.identity(p) for p in parts], axis=0))
    return out


def check_parts(parts: list[tf.Tensor], devices: list[str], sizes: list[int], rank: int) -> None:
    """Each local part has the rows `sizes` gives its device, and the same trailing shape.

    Raises:
      ValueError: naming the part and what it should be.
    """
    if len(parts) != len(devices):
        raise ValueError(
            f"All-gather needs one part per device; got {len(parts)} parts and {len(devices)} "
            "devices."
        )
    for i, part in enumerate(parts):
        want = sizes[rank + i]
        if part.shape.rank is None or part.shape.rank == 0 or part.shape[0] != want:
            raise ValueError(
                f"Part {i} must have {want} rows (its entry of `sizes`); got shape {part.shape}."
            )
        if part.dtype != parts[0].dtype or part.shape[1:] != parts[0].shape[1:]:
            raise ValueError(
                f"Parts must agree in dtype and in every axis but the first; part 0 is "
                f"{parts[0].dtype.name}{parts[0].shape} and part {i} is "
                f"{part.dtype.name}{part.shape}."
            )
