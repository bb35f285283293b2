"""An all-reduce over every worker's towers: one `CollectiveReduceV2` per local device."""

import zlib
from collections.abc import Sequence

from towers._workers import current_workers
from towers.ops._all_reduce.base import AllReduce, to_wire
from towers.ops._all_reduce.by_name import all_reduce_algorithm
from towers.ops._all_reduce.collective import ordering_token, outermost_graph
from towers.ops._tensorflow import tf

# Group keys of cross-worker reductions: the same on every worker (derived, not drawn), below
# the ranges of towers.ops' CollectiveAllReduce and of cross_tower_sum.
_GROUP_BASE = 2**18
# Graph collection numbering this trace's cross-worker reductions (state of the graph).
_CALLS = "towers.worker_all_reduce_calls"


class WorkersAllReduce(AllReduce):
    """Sums over the devices of every worker (`towers.init_workers`), each its local ones.

    Every worker builds the same reductions in the same order; each reduction is one
    `CollectiveReduceV2` per local device, in a group of all workers' devices. Keys agree
    across workers without talking: the group key follows from the group's size, and an
    instance key from the reduction's number within the trace, its shape and its dtype, so a
    worker that retraces alone (a short last batch) still meets the others, and two functions
    of one process never reuse a key at another shape (which TensorFlow's runtime refuses for
    good). Every worker must have the same number of towers.

    Args:
      timeout_seconds: How long a reduction may wait for the other workers (a dead worker is
        usually reported sooner, by the heartbeats `init_workers` configures).
    """

    name = "workers"

    def __init__(self, timeout_seconds: float = 300.0):
        if isinstance(timeout_seconds, bool) or not isinstance(timeout_seconds, (int, float)):
            raise ValueError(f"`timeout_seconds` must be a number; got {timeout_seconds!r}.")
        if timeout_seconds <= 0:
            raise ValueError(f"`timeout_seconds` must be positive; got {timeout_seconds!r}.")
        self.timeout_seconds = float(timeout_seconds)

    @tf.autograph.experimental.do_not_convert
    def __call__(
        self,
        values: Sequence[tf.Tensor],
        devices: Sequence[str],
        *,
        reduction: str = "sum",
        wire_dtype: tf.DType | None = None,
    ) -> list[tf.Tensor]:
        """All-reduces over every worker; with one local device too (unlike the base)."""
        if reduction != "sum" or len(values) > 1:
            return super().__call__(values, devices, reduction=reduction, wire_dtype=wire_dtype)
        return self.sum([tf.convert_to_tensor(v) for v in values], list(devices), wire_dtype)

    def sum(
        self, values: list[tf.Tensor], devices: list[str], wire_dtype: tf.DType | None
    ) -> list[tf.Tensor]:
        """One `CollectiveReduceV2` per local device over every worker's; see `AllReduce.sum`.

        Raises:
          ValueError: outside `tf.function`, or if a device repeats.
        """
        if tf.executing_eagerly() or not tf.compat.v1.executing_eagerly_outside_functions():
            raise ValueError(
                "The 'workers' all-reduce must be built inside tf.function: wrap the step in "
                "@tf.function."
            )
        if len(set(devices)) != len(devices):
            raise ValueError(f"The 'workers' all-reduce needs distinct devices; got {devices}.")
        group_size = len(devices) * current_workers().num_workers
        instance = _instance_key(values[0])
        out = []
        for value, device in zip(values, devices):
            with tf.device(device):
                summed = tf.raw_ops.CollectiveReduceV2(
                    input=to_wire(value, wire_dtype),
                    group_size=group_size,
                    group_key=_GROUP_BASE + group_size,
                    instance_key=instance,
                    ordering_token=[ordering_token(device)],
                    merge_op="Add",
                    final_op="Id",
                    timeout_seconds=self.timeout_seconds,
                )
                out.append(tf.cast(summed, value.dtype))
        return out


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


@tf.function
def broadcast_from_chief(algorithm: AllReduce, devices: list, groups: list) -> None:
    """Every copy of every variable takes worker 0's first copy's value.

    A sum over every worker's devices of that value and zeros.
    """
    chief = current_workers().is_chief
    for copies in groups:
        values = []
        for i, (copy, device) in enumerate(zip(copies, devices)):
            with tf.device(device):
                mine = copy.read_value()
                values.append(mine if chief and i == 0 else tf.zeros_like(mine))
        for copy, value in zip(copies, algorithm(values, devices)):
            copy.assign(value)


def _instance_key(value: tf.Tensor) -> int:
    """The next reduction's key in this trace, the same on every worker.

    Its number in the trace, shape and dtype, hashed with crc32 (Python's hash is salted per
    process) into [1, 2**31).
    """
    graph = outermost_graph(tf.compat.v1.get_default_graph())
    kept = graph.get_collection_ref(_CALLS)
    if not kept:
        kept.append([0])
    kept[0][0] += 1
    signature = f"{kept[0][0]}:{value.shape}:{value.dtype.name}".encode()
    return 1 + zlib.crc32(signature) % (2**31 - 1)
