"""Sharded optimizer state for `Replicated`: each copy keeps the state of its own variables.

Each variable gets one owner among the group's devices (whole variables, balanced by bytes:
`ops.internal.owners_by_bytes`). A step reduce-scatters the gradients (each owner gets the
mean gradient of its variables), each owner updates its variables with its state, and the
updated values are all-gathered into every copy, so every copy ends the step with the same
bits, and they equal the unsharded step's (the same optimizer arithmetic on the same values).
With a gradient hook the gradients are all-reduced instead (the hook sees every gradient on
every copy, as unsharded), and each copy still updates only its own.
"""

from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from towers.ops.internal import (
    Gradient,
    Weight,
    gather_from_owners,
    owners_by_bytes,
    reduce_to_owners,
    update_ops,
)
from towers.variables._strategy import ReducedGradients


class ShardedState:
    """Which device of the group owns each variable, and the step's two exchanges.

    Args:
      variables: The first replica's trainable variables (every replica's align with them).
      algorithm: The all-reduce (its group may span workers).
      num_devices: This process's devices.

    Raises:
      ValueError: if a variable's shape is not static.
    """

    def __init__(self, variables: list[tf.Variable], algorithm: Any, num_devices: int):
        unknown = [v.name for v in variables if not v.shape.is_fully_defined()]
        if unknown:
            raise ValueError(
                f"shard_optimizer_state=True balances variables by their bytes and packs them "
                f"by their shapes, which must be static; {unknown} have none. Give them static "
                "shapes, or pass shard_optimizer_state=False."
            )
        self.algorithm = algorithm
        self.rank = algorithm.group_rank(num_devices)
        self.owners = owners_by_bytes(variables, algorithm.group_size(num_devices))
        self._owner_of = {var.ref(): owner for var, owner in zip(variables, self.owners)}

    def owns(self, index: int) -> tuple[bool, ...]:
        """For each variable, whether this process's device `index` owns it."""
        return tuple(owner == self.rank + index for owner in self.owners)

    def reduce(
        self,
        replicas: Any,
        tower_grads: list[list[Gradient]],
        weights: Sequence[Weight],
        every_gradient: bool,
    ) -> list[ReducedGradients]:
        """Each copy's share of the reduced gradients (all of them with `every_gradient`)."""
        if every_gradient:
            reduced = replicas.all_reduce(tower_grads, weights=weights)
        else:
            reduced = reduce_to_owners(
                tower_grads,
                replicas.devices,
                self.owners,
                weights=weights,
                algorithm=self.algorithm,
                bucket_bytes=replicas.bucket_bytes,
                wire_dtype=replicas.wire_dtype,
                sparse=replicas.sparse,
                variables=replicas.variables_of(0),
            )
        beyond = self.algorithm.group_size(len(replicas.devices)) != len(replicas.devices)
        finite = self._finite_everywhere(reduced, replicas.devices) if beyond else None
        return [
            ReducedGradients(
                grads, replicas.variables_of(i), device, self.owns(i), finite[i] if finite else None
            )
            for i, (grads, device) in enumerate(zip(reduced, replicas.devices))
        ]

    def _finite_everywhere(self, reduced: list[list[Gradient]], devices: list[str]) -> list:
        """Whether every worker's shares are finite, on each device.

        An all-reduce of one count, so that a step one worker skips (or fails) is skipped
        (failed) by all.
        """
        bad = []
        for grads, device in zip(reduced, devices):
            with tf.device(device):
                values = [g.values if isinstance(g, tf.IndexedSlices) else g for g in grads]
                checks = [tf.reduce_all(tf.math.is_finite(v)) for v in values if v is not None]
                finite = tf.reduce_all(tf.stack(checks)) if checks else tf.constant(True)
                bad.append(tf.reshape(tf.cast(tf.logical_not(finite), tf.float32), [1]))
        totals = self.algorithm(bad, devices)
        out = []
        for total, device in zip(totals, devices):
            with tf.device(device):
                out.append(tf.equal(total[0], 0.0))
        return out

    def gather(self, replicas: Any, updates: list) -> list:
        """Every copy takes each variable's value from its owner, after the updates."""
        copies = [replicas.variables_of(i) for i in range(len(replicas.devices))]
        with tf.control_dependencies(update_ops(updates)):
            values = []
            for i, (variables, device) in enumerate(zip(copies, replicas.devices)):
                with tf.device(device):
                    owned = self.owns(i)
                    values.append(
                        [v.read_value() if own else None for v, own in zip(variables, owned)]
                    )
        gathered = gather_from_owners(
            values,
            replicas.devices,
            self.owners,
            algorithm=self.algorithm,
            bucket_bytes=replicas.bucket_bytes,
            like=copies[0],
        )
        assigned = []
        for variables, device, new in zip(copies, replicas.devices, gathered):
            with tf.device(device):  # the owner too: its value, as every copy gets it
                assigned += [
                    var.assign(value, read_value=False) for var, value in zip(variables, new)
                ]
        return [a for a in assigned if a is not None]

    def state_copies(self, copies: dict[str, tuple[tf.Variable, ...]]) -> dict[str, tuple]:
        """Each variable's copies, None but its owner's.

        None everywhere if another process owns it; variables not trained (never updated)
        keep theirs on the first copy.
        """
        out = {}
        for name, group in copies.items():
            local = self._owner_of.get(group[0].ref(), self.rank) - self.rank
            out[name] = tuple(var if i == local else None for i, var in enumerate(group))
        return out
