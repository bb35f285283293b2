"""The built-in flat all-reduces by name: every algorithm that reduces in one level.

A new built-in algorithm is its module in this folder and its line here; `ops.ALGORITHMS`
and `ops.all_reduce_algorithm` add `hierarchical`, which runs one of these among its groups'
leaders.
"""

from towers.ops._all_reduce.auto import AutoAllReduce
from towers.ops._all_reduce.base import AllReduce
from towers.ops._all_reduce.collective import CollectiveAllReduce
from towers.ops._all_reduce.gather_add import GatherAddAllReduce
from towers.ops._all_reduce.nccl import NcclAllReduce
from towers.ops._all_reduce.reduce_broadcast import ReduceBroadcastAllReduce
from towers.ops._all_reduce.ring import RingAllReduce

FLAT: dict[str, type[AllReduce]] = {
    c.name: c
    for c in (
        AutoAllReduce,
        CollectiveAllReduce,
        GatherAddAllReduce,
        NcclAllReduce,
        ReduceBroadcastAllReduce,
        RingAllReduce,
    )
}


def flat_algorithm(algorithm: str | AllReduce, argument: str) -> AllReduce:
    """`algorithm` as an instance: a new one for a name of `FLAT`, else itself.

    Args:
      algorithm: A name of `FLAT` or an `ops.AllReduce`.
      argument: The argument's name, for the messages.

    Returns:
      An `AllReduce`.

    Raises:
      ValueError: if the name is unknown.
      TypeError: if `algorithm` is neither a name nor an `AllReduce`.
    """
    if isinstance(algorithm, AllReduce):
        return algorithm
    if not isinstance(algorithm, str):
        raise TypeError(
            f"`{argument}` must be a name from {tuple(sorted(FLAT))} or an ops.AllReduce; got "
            f"{type(algorithm).__name__}."
        )
    if algorithm not in FLAT:
        raise ValueError(f"`{argument}` must be one of {tuple(sorted(FLAT))}; got {algorithm!r}.")
    return FLAT[algorithm]()
