"""Optimizer state sharded across workers: gathered for the chief's save, restored by owners.

With `Replicated(shard_optimizer_state=True)` over several workers, the state of a variable
(its slots, its accumulated gradient) lives on its owner's worker alone. At each save the
state worker 0 lacks is all-gathered over the workers' devices (every worker calls `save`,
as each runs the same loop), and the chief writes one whole state file under the usual
tower-free names, which any program restores. At a restore each worker takes the state of
the variables its devices own and leaves the rest of the file to their owners.
"""

from collections.abc import Mapping
from typing import Any

import numpy as np
import tensorflow as tf

from towers.ops.internal import gather_from_owners
from towers.optimizers import Optimizer
from towers.step import GradientAccumulator
from towers.variables import Copies, Replicated, Target, variable_copies
from towers.variables import state_copies as copies_keeping_state


def spans_workers(model: Target) -> bool:
    """Whether `model` shards its optimizer state over several workers."""
    if not isinstance(model, Replicated) or not model.shard_optimizer_state:
        return False
    return model.algorithm.group_size(len(model.devices)) != len(model.devices)


def followed_state(optimizer: Any, extra: Mapping[str, Target], variable: str) -> list[str]:
    """The names of the state that follows `variable` (kept by its owner when sharded)."""
    names = []
    if isinstance(optimizer, Optimizer):
        names += [f"slots/{variable}/{slot}" for slot in optimizer.slot_names]
    names += [
        f"extra/{key}/sums/{variable}"
        for key, target in extra.items()
        if isinstance(target, GradientAccumulator)
    ]
    return names


def state_elsewhere(model: Target, optimizer: Any, extra: Mapping[str, Target]) -> set[str]:
    """The state names this worker keeps no copy of (other workers' devices own them)."""
    if not spans_workers(model):
        return set()
    return {
        name
        for variable, group in copies_keeping_state(model).items()
        if all(copy is None for copy in group)
        for name in followed_state(optimizer, extra, variable)
    }


def gather_for_chief(
    model: Replicated, state: dict[str, tuple[tf.Variable, tf.Variable | None]]
) -> dict[str, tf.Tensor]:
    """The state worker 0 keeps no copy of, all-gathered from its owners' workers.

    Every worker must call it alike (the same `state` names, in the same order).

    Args:
      model: The `Replicated`, its state sharded across workers.
      state: State name -> (the first copy of the variable it follows, this worker's copy
        of the state: on the owner's device, or None where another worker owns it).

    Returns:
      State name -> its value on this worker's first device, for each state whose variable
      a device of another worker than worker 0 owns.

    Raises:
      ValueError: if an owner's device lacks its state.
    """
    local = len(model.devices)
    rank = model.algorithm.group_rank(local)
    owner_of = {var.ref(): owner for var, owner in zip(model.variables_of(0), model.owners)}
    wanted = [  # worker 0's devices are ranks 0..K-1; variables not trained stay on each
        (name, var, mine)
        for name, (var, mine) in state.items()
        if owner_of.get(var.ref(), 0) >= local
    ]
    if not wanted:
        return {}
    owners = [owner_of[var.ref()] for _, var, _ in wanted]
    values = [[None] * len(wanted) for _ in model.devices]
    for j, ((name, _, mine), owner) in enumerate(zip(wanted, owners)):
        if 0 <= owner - rank < local:
            if mine is None:
                raise ValueError(f"The state {name!r} is missing on its owner's device.")
            with tf.device(model.devices[owner - rank]):
                values[owner - rank][j] = tf.identity(mine.read_value())
    gathered = gather_from_owners(
        values,
        model.devices,
        owners,
        algorithm=model.algorithm,
        bucket_bytes=model.bucket_bytes,
        like=[var for _, var, _ in wanted],
    )
    return {name: value for (name, _, _), value in zip(wanted, gathered[0])}


class ChiefShares:
    """At each save, the state the chief lacks: gathered from every worker, to write.

    Built once per `CheckpointManager` whose model shards its state across workers; in a v1
    graph its ops are built here, into `session`'s graph (before it is finalized).

    Args:
      model: The `Replicated`.
      optimizer: Its optimizer.
      extra: The manager's extra state.
      local: The state this worker keeps: name -> its copies (`state_copies`).
      session: For a v1 graph, the session running the gather.

    Raises:
      ValueError: in a v1 graph already finalized.
    """

    def __init__(
        self,
        model: Replicated,
        optimizer: Any,
        extra: Mapping[str, Target],
        local: Copies,
        session: Any = None,
    ):
        self.model, self.session = model, session
        self.state = {}
        for variable, copies in variable_copies(model).items():
            for name in followed_state(optimizer, extra, variable):
                mine = local.get(name, ())
                self.state[name] = (copies[0], mine[0] if mine else None)
        self._tensors = None
        if session is not None:
            if session.graph.finalized:
                raise ValueError(
                    "With shard_optimizer_state=True across workers, a v1 CheckpointManager "
                    "builds the gather of the state other workers keep into the graph: "
                    "create it before the graph is finalized (before a MonitoredSession)."
                )
            with session.graph.as_default():
                self._tensors = gather_for_chief(model, self.state)

    def arrays(self) -> dict[str, np.ndarray]:
        """The gathered state, by name (every worker must call it at the same save)."""
        if self.session is not None:
            names = list(self._tensors)
            values = self.session.run([self._tensors[n] for n in names])
            return {n: np.asarray(v) for n, v in zip(names, values)}
        gathered = tf.function(lambda: gather_for_chief(self.model, self.state))()
        return {name: np.asarray(value.numpy()) for name, value in gathered.items()}
