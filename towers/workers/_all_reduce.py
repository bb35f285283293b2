"""An all-reduce over every worker's towers: one `CollectiveReduceV2` per local device."""

import tensorflow as tf

from towers.ops import (
    AllReduce,
    CollectiveAllReduce,
    all_reduce_algorithm,
    collective_order,
    internal,
)
from towers.ops.internal import check_bool
from towers.workers._cluster import current_workers

# The default timeout of reductions in v1 graphs (see WorkersAllReduce), in seconds.
V1_TIMEOUT_SECONDS = 300.0


class WorkersAllReduce(CollectiveAllReduce):
    """Sums over the devices of every worker (`towers.init_workers`), each its local ones.

    Every worker builds the same reductions in the same order; each reduction is a
    `CollectiveReduceV2` in a group that spans the workers (every device of every worker, or
    with `local_first` each worker's first device). Keys agree across workers without
    talking: the group key follows from the group's size and the local devices' types and
    indices, and an instance key from the reduction's number within the trace, its shape and
    its dtype, so a worker that retraces alone (a short last batch) still meets the others,
    and two functions of one process never reuse a key at another shape (which TensorFlow's
    runtime refuses for good). Every worker must have the same number of towers. The
    reductions themselves are `CollectiveAllReduce`'s (ordering tokens, checks), with these
    keys.

    Hierarchical (`local_first=True`): each worker first adds its towers' values on its first
    device, the workers all-reduce those sums (one value per worker crosses the network), and
    each worker copies the total to its other devices.

    Args:
      timeout_seconds: How long a reduction may wait for the other workers. None (the
        default): no timeout inside `tf.function`, where the heartbeats `init_workers`
        configures report a dead or frozen worker and a timeout would cost about 2 ms per
        reduction on loopback (TensorFlow 2.21); in a v1 graph, whose waiting collectives do
        not hear the heartbeats, 300 s. Set one to bound both, or to guard against workers
        that build different steps.
      local_first: Whether to reduce within each worker first (see above).
    """

    name = "workers"
    v1_timeout_seconds = V1_TIMEOUT_SECONDS

    def __init__(self, timeout_seconds: float | None = None, *, local_first: bool = True):
        super().__init__(timeout_seconds)
        self.local_first = check_bool(local_first, "local_first")

    def group_size(self, num_values: int) -> int:
        """Every worker's devices: `num_values` local ones times the number of workers."""
        return num_values * current_workers().num_workers

    def group_rank(self, num_values: int) -> int:
        """This worker's first device's rank: the workers' devices in worker order."""
        return current_workers().index * num_values

    def keys(self, value: tf.Tensor, devices: list[str]) -> tuple[int, int, int]:
        """Keys every worker derives alike; see the class docstring."""
        size = self.group_size(len(devices))
        keys = internal.WORKER_LEADERS if self.local_first else internal.WORKERS
        number = internal.trace_count("workers_all_reduce")  # the same on every worker
        signature = f"{number}:{value.shape}:{value.dtype.name}"
        return (
            size,
            internal.derived_group_key(keys, devices, size),
            internal.derived_instance_key(signature),
        )

    def sum(
        self, values: list[tf.Tensor], devices: list[str], wire_dtype: tf.DType | None
    ) -> list[tf.Tensor]:
        """Across workers, after a local sum when `local_first`; see `AllReduce.sum`."""
        if not self.local_first or len(set(devices)) != len(devices):
            return super().sum(values, devices, wire_dtype)  # which refuses repeated devices
        local = internal.sum_on(devices[0], values, devices, wire_dtype)
        (total,) = super().sum([local], devices[:1], wire_dtype)
        return internal.spread(total, devices[0], devices, values[0].dtype, wire_dtype)


def algorithm_for_workers(all_reduce: str | AllReduce) -> AllReduce:
    """The all-reduce: as named, or across workers after `towers.init_workers`.

    Raises:
      ValueError: for an algorithm that cannot span workers when there are several.
    """
    if current_workers().num_workers == 1:
        return all_reduce_algorithm(all_reduce)
    if all_reduce in ("auto", "workers"):
        return WorkersAllReduce()
    if isinstance(all_reduce, WorkersAllReduce):
        return all_reduce
    raise ValueError(
        f"With {current_workers().num_workers} workers the all-reduce must span them: use "
        f"all_reduce='auto' (or a towers WorkersAllReduce); got {all_reduce!r}."
    )


def broadcast_from_chief(algorithm: AllReduce, devices: list, groups: list) -> tf.Operation | None:
    """Every copy of every variable takes worker 0's first copy's value.

    A sum over every worker's devices of that value and zeros: run now (eagerly), or the op
    that does it (in a v1 graph).
    """
    if tf.compat.v1.executing_eagerly_outside_functions():
        _broadcast_now(algorithm, devices, groups)
        return None
    with collective_order():
        return tf.group(_assign_chiefs(algorithm, devices, groups))


@tf.function
def _broadcast_now(algorithm: AllReduce, devices: list, groups: list) -> None:
    _assign_chiefs(algorithm, devices, groups)


def _assign_chiefs(algorithm: AllReduce, devices: list, groups: list) -> list:
    """The assignments of worker 0's first copies to every copy."""
    chief, assigned = current_workers().is_chief, []
    for copies in groups:
        values = []
        for i, (copy, device) in enumerate(zip(copies, devices)):
            with tf.device(device):
                mine = copy.read_value()
                values.append(mine if chief and i == 0 else tf.zeros_like(mine))
        for copy, value in zip(copies, algorithm(values, devices)):
            assigned.append(copy.assign(value))
    return assigned
