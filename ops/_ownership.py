"""Who owns which variable, and the buffers owned variables travel in, owner by owner."""

from collections.abc import Sequence

from towers.ops._tensorflow import tf

Buffer = tuple[tuple[int, ...], ...]  # for each rank of the group, the variables it owns in it


def owners_by_bytes(variables: Sequence[tf.Variable | tf.Tensor], group: int) -> list[int]:
    """An owner (0 to `group - 1`) per variable, balancing bytes: largest first, to the least.

    Whole variables, so that a rule needing a variable's norm (LAMB, LARS) has it on one
    device; each device then owns at most 1/group of the bytes plus one variable.

    Args:
      variables: Variables (or tensors) with static shapes.
      group: The number of devices to spread them over, >= 1.

    Returns:
      `owners[j]`: the rank that owns variable j. The same for the same shapes, on every
      worker.
    """
    load = [0] * group
    owners = [0] * len(variables)
    order = sorted(range(len(variables)), key=lambda j: (-_bytes(variables[j]), j))
    for j in order:
        rank = min(range(group), key=lambda r: (load[r], r))
        owners[j] = rank
        load[rank] += _bytes(variables[j])
    return owners


def _bytes(value: tf.Variable | tf.Tensor) -> int:
    return (value.shape.num_elements() or 0) * value.dtype.size


def layout(
    shapes: Sequence[tf.TensorShape],
    dtypes: Sequence[tf.DType],
    owners: Sequence[int],
    group: int,
    bucket_bytes: int | None,
) -> list[Buffer]:
    """The buffers variables travel in: per dtype, each rank's variables in order.

    Without `bucket_bytes`, a buffer per variable; with it, each buffer takes from every rank
    its next variables up to `bucket_bytes / group` bytes (at least one while it has any).
    """
    if bucket_bytes is None:
        return [
            tuple((j,) if r == owners[j] else () for r in range(group)) for j in range(len(shapes))
        ]
    buffers = []
    for dtype in dict.fromkeys(dtypes):
        queues = [
            [j for j in range(len(shapes)) if dtypes[j] == dtype and owners[j] == r]
            for r in range(group)
        ]
        share = max(1, bucket_bytes // group)
        while any(queues):
            buffer = []
            for queue in queues:
                taken, used = [], 0
                while queue and (
                    not taken or used + shapes[queue[0]].num_elements() * dtype.size <= share
                ):
                    used += shapes[queue[0]].num_elements() * dtype.size
                    taken.append(queue.pop(0))
                buffer.append(tuple(taken))
            buffers.append(tuple(buffer))
    return buffers
