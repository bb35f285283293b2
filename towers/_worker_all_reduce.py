"""An all-reduce over every worker's towers: one `CollectiveReduceV2` per local device."""

import zlib

from towers._workers import current_workers
from towers.ops._all_reduce.base import AllReduce, spread, sum_on
from towers.ops._all_reduce.by_name import all_reduce_algorithm
from towers.ops._all_reduce.collective import (
    CollectiveAllReduce,
    collective_order,
    outermost_graph,
)
from towers.ops._tensorflow import tf

# Group keys of cross-worker reductions: the same on every worker (derived, not drawn), in
# [2**18, 2**18 + 2**17), below the ranges of towers.ops' CollectiveAllReduce and of
# cross_tower_sum within one worker.
_GROUP_BASE = 2**18
# The default timeout of reductions in v1 graphs (see WorkersAllReduce), in seconds.
V1_TIMEOUT_SECONDS = 300.0
_LEADERS_BASE = 2**16  # offset of the groups of one device per worker (local_first)
# Graph collection numbering this trace's cross-worker reductions (state of the graph).
_CALLS = "towers.worker_all_reduce_calls"


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
        if not isinstance(local_first, bool):
            raise TypeError(f"`local_first` must be a bool; got {type(local_first).__name__}.")
        self.local_first = local_first

    def group_size(self, num_values: int) -> int:
        """Every worker's devices: `num_values` local ones times the number of workers."""
        return num_values * current_workers().num_workers

    def keys(self, value: tf.Tensor, devices: list[str]) -> tuple[int, int, int]:
        """Keys every worker derives alike; see the class docstring."""
        size = self.group_size(len(devices))
        base = _GROUP_BASE + (_LEADERS_BASE if self.local_first else 0)
        return size, workers_group_key(base, devices, size), _instance_key(value)

    def sum(
        self, values: list[tf.Tensor], devices: list[str], wire_dtype: tf.DType | None
    ) -> list[tf.Tensor]:
        """Across workers, after a local sum when `local_first`; see `AllReduce.sum`."""
        if not self.local_first or len(set(devices)) != len(devices):
            return super().sum(values, devices, wire_dtype)  # which refuses repeated devices
        local = sum_on(devices[0], values, devices, wire_dtype)
        (total,) = super().sum([local], devices[:1], wire_dtype)
        return spread(total, devices[0], devices, values[0].dtype, wire_dtype)


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


def workers_group_key(base: int, devices: list[str], size: int) -> int:
    """A group key every worker derives alike, in [base, base + 2**16).

    From the group's size and the local devices' types and indices (not their job or task,
    which differ between workers): two device sets of one worker get different keys.
    """
    local = ",".join(
        f"{spec.device_type}:{spec.device_index}"
        for spec in map(tf.DeviceSpec.from_string, devices)
    )
    return base + zlib.crc32(f"{size}|{local}".encode()) % 2**16


def _instance_key(value: tf.Tensor) -> int:
    """The next reduction's key in this trace, the same on every worker.

    From its number in the trace, shape and dtype.
    """
    graph = outermost_graph(tf.compat.v1.get_default_graph())
    kept = graph.get_collection_ref(_CALLS)
    if not kept:
        kept.append([0])
    kept[0][0] += 1
    return derived_key(f"{kept[0][0]}:{value.shape}:{value.dtype.name}")


def derived_key(signature: str) -> int:
    """An instance key every worker derives alike from `signature`, in [1, 2**31).

    crc32, since Python's own hash is salted per process.
    """
    return 1 + zlib.crc32(signature.encode()) % (2**31 - 1)
