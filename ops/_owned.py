"""Variables owned by one device each: gradients reduced to the owner, values gathered from it.

Sharded optimizer state (`towers.Replicated(..., shard_optimizer_state=True)`) gives each
variable one owner among the group's devices. `reduce_to_owners` reduce-scatters the tower
gradients so that each owner holds the mean gradient of its variables only; after the owners'
updates, `gather_from_owners` all-gathers their values so that every device has every
variable. Both pack variables per dtype into buffers laid out owner by owner (`layout`), one
reduce-scatter or all-gather per buffer, each device's part its own variables.
"""

from collections.abc import Sequence

import numpy as np

from towers.ops._all_reduce.base import AllReduce
from towers.ops._all_reduce.by_name import all_reduce_algorithm
from towers.ops._all_reduce_gradients import check_options, weights_of, wire_for
from towers.ops._autograph import library_code
from towers.ops._collectives import collective_order
from towers.ops._gathered_slices import slices_on
from towers.ops._ownership import Buffer, layout
from towers.ops._tensorflow import tf
from towers.ops._tower_grads import (
    Gradient,
    check_column,
    check_tower_grads,
    column_dtype,
    dense_column,
)
from towers.ops._weighted_mean import scale


@library_code
def reduce_to_owners(
    tower_grads: Sequence[Sequence[Gradient]],
    devices: Sequence[str],
    owners: Sequence[int],
    *,
    weights: Sequence | None = None,
    algorithm: str | AllReduce = "auto",
    bucket_bytes: int | None = 4 * 2**20,
    wire_dtype: tf.DType | None = None,
    sparse: str = "gather",
    variables: Sequence[tf.Variable] | None = None,
) -> list[list[Gradient]]:
    """The weighted mean of the tower gradients, each variable's on its owner only.

    `all_reduce_gradients`' counterpart for owned variables: result i holds, for every
    variable device i owns (`owners[j] == algorithm.group_rank(K) + i`), the mean gradient,
    and None for the others. Dense gradients are reduce-scattered (`AllReduce.reduce_scatter`)
    in buffers laid out owner by owner; `tf.IndexedSlices` are gathered to their owner, each
    row once; float16/bfloat16 are reduced in float32 and cast back on the owner.

    Args:
      tower_grads: K lists of N gradients, tower i's on `devices[i]`.
      devices: The K devices.
      owners: The owner rank of each of the N variables, in the algorithm's group.
      weights: K weights (shard sizes), normalized; None for the plain mean.
      algorithm: A name from `ops.ALGORITHMS` or an `ops.AllReduce`.
      bucket_bytes: The largest buffer; None for one reduce-scatter per variable.
      wire_dtype: None, tf.float16 or tf.bfloat16.
      sparse: "gather" or "dense".
      variables: Tower 0's N variables, optional (errors name them; shapes checked).

    Returns:
      K lists of N gradients, None where the device does not own the variable.

    Raises:
      ValueError: as `all_reduce_gradients`, or if `owners` is not one rank per variable.
      TypeError: as `all_reduce_gradients`.
    """
    tower_grads = check_tower_grads(tower_grads, variables)
    devices = list(devices)
    check_options(bucket_bytes, wire_dtype, sparse)
    algorithm = all_reduce_algorithm(algorithm)
    owners = _checked_owners(owners, len(tower_grads[0]), algorithm.group_size(len(devices)))
    with collective_order():  # in a v1 graph, these collectives chain among themselves
        return _reduce(tower_grads, devices, owners, weights, algorithm, bucket_bytes,
                       wire_dtype, sparse, variables)  # fmt: skip


def _reduce(tower_grads, devices, owners, weights, algorithm, bucket_bytes, wire_dtype, sparse,
            variables) -> list[list[Gradient]]:  # fmt: skip
    group, rank = algorithm.group_size(len(devices)), algorithm.group_rank(len(devices))
    norm, _ = weights_of(weights, devices, algorithm, None, wire_dtype)
    out: list[list[Gradient]] = [[None] * len(owners) for _ in devices]
    dense = {}
    for j, column in enumerate(zip(*tower_grads)):
        name = variables[j].name if variables is not None else f"#{j}"
        if not check_column(column, name, variables[j] if variables is not None else None):
            continue
        local = owners[j] - rank
        sparse_here = group == len(devices) and sparse == "gather"
        if sparse_here and all(isinstance(g, tf.IndexedSlices) for g in column):
            out[local][j] = slices_on(devices[local], list(column), devices, norm)
        else:
            variable = variables[j] if variables is not None else None
            dense[j] = dense_column(list(column), devices, variable)
    for buffer in _dense_layout(dense, tower_grads, owners, group, bucket_bytes):
        for i, reduced in enumerate(
            _scatter(buffer, dense, devices, norm, algorithm, rank, wire_dtype)
        ):
            for j, grad in reduced.items():
                with tf.device(devices[i]):  # half precision: cast back on the owner
                    out[i][j] = tf.cast(grad, column_dtype(tower_grads, j))
    return out


def _dense_layout(dense, tower_grads, owners, group, bucket_bytes) -> list[Buffer]:
    js = sorted(dense)
    shapes = [dense[j][0].shape for j in js]
    dtypes = [dense[j][0].dtype for j in js]
    buffers = layout(shapes, dtypes, [owners[j] for j in js], group, bucket_bytes)
    return [tuple(tuple(js[m] for m in members) for members in buffer) for buffer in buffers]


def _scatter(buffer, dense, devices, norm, algorithm, rank, wire_dtype) -> list[dict]:
    """Reduce-scatters one buffer; for each local device, its variables' summed gradients."""
    members = [j for part in buffer for j in part]
    sizes = [sum(dense[j][0].shape.num_elements() for j in part) for part in buffer]
    flat = []
    for i, device in enumerate(devices):
        with tf.device(device):
            values = tf.concat([tf.reshape(dense[j][i], [-1]) for j in members], axis=0)
            flat.append(scale(values, norm[i]))
    parts = algorithm.reduce_scatter(
        flat, devices, sizes=sizes, wire_dtype=wire_for(flat[0], wire_dtype)
    )
    out = []
    for i, (part, device) in enumerate(zip(parts, devices)):
        mine = buffer[rank + i]
        with tf.device(device):
            pieces = (
                tf.split(part, [dense[j][0].shape.num_elements() for j in mine])
                if len(mine) > 1
                else [part]
            )
            out.append({j: tf.reshape(p, dense[j][0].shape) for j, p in zip(mine, pieces) if mine})
    return out


@library_code
def gather_from_owners(
    values: Sequence[Sequence[tf.Tensor | None]],
    devices: Sequence[str],
    owners: Sequence[int],
    *,
    algorithm: str | AllReduce = "auto",
    bucket_bytes: int | None = 4 * 2**20,
    like: Sequence[tf.Variable | tf.Tensor],
) -> list[list[tf.Tensor]]:
    """Every variable's value from its owner, on every device: the same bits everywhere.

    Args:
      values: K lists of N: on `devices[i]`, the value of each variable it owns, None for
        the others.
      devices: The K devices.
      owners: The owner rank of each variable, in the algorithm's group.
      algorithm: A name from `ops.ALGORITHMS` or an `ops.AllReduce`.
      bucket_bytes: The largest buffer; None for one all-gather per variable.
      like: The N variables (or tensors): their shapes and dtypes.

    Returns:
      K lists of N tensors, list i on `devices[i]`.

    Raises:
      ValueError: if `owners` is not one rank per variable, or a device lacks a value it
        owns.
    """
    devices = list(devices)
    algorithm = all_reduce_algorithm(algorithm)
    group, rank = algorithm.group_size(len(devices)), algorithm.group_rank(len(devices))
    owners = _checked_owners(owners, len(like), group)
    if len(values) != len(devices) or any(len(v) != len(like) for v in values):
        raise ValueError(
            f"`values` must be one list of {len(like)} values (or None) per device; got "
            f"{[len(v) for v in values]} for {len(devices)} devices."
        )
    with collective_order():
        return _gather(values, devices, owners, algorithm, bucket_bytes, like, group, rank)


def _gather(values, devices, owners, algorithm, bucket_bytes, like, group, rank) -> list:
    shapes, dtypes = [v.shape for v in like], [v.dtype for v in like]
    out: list[list] = [[None] * len(like) for _ in devices]
    for buffer in layout(shapes, dtypes, owners, group, bucket_bytes):
        sizes = [sum(shapes[j].num_elements() for j in part) for part in buffer]
        local = []
        for i, device in enumerate(devices):
            mine = buffer[rank + i]
            if any(values[i][j] is None for j in mine):
                raise ValueError(f"Device {device!r} owns a variable but gives no value for it.")
            with tf.device(device):
                flat = [tf.reshape(values[i][j], [-1]) for j in mine]
                empty = tf.zeros([0], dtypes[_first_member(buffer)])
                local.append(tf.concat(flat, axis=0) if flat else empty)
        members = [j for part in buffer for j in part]
        for i, whole in enumerate(algorithm.all_gather(local, devices, sizes=sizes)):
            with tf.device(devices[i]):
                pieces = (
                    tf.split(whole, [shapes[j].num_elements() for j in members])
                    if len(members) > 1
                    else [whole]
                )
                for j, piece in zip(members, pieces):
                    out[i][j] = tf.reshape(piece, shapes[j])
    return out


def _first_member(buffer: Buffer) -> int:
    return next(j for part in buffer for j in part)


def _checked_owners(owners: Sequence[int], num: int, group: int) -> list[int]:
    owners = list(owners)
    valid = all(
        isinstance(r, (int, np.integer)) and not isinstance(r, bool) and 0 <= r < group
        for r in owners
    )
    if len(owners) != num or not valid:
        raise ValueError(
            f"`owners` must give each of the {num} variables a rank in [0, {group}); got {owners}."
        )
    return owners
