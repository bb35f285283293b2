"""The replicated variable strategy: one copy of the model per tower device, kept identical."""

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

import towers.ops as ops
from towers.core import TowerContext, check_devices_exist, current_tower, device_list
from towers.ops.internal import (
    Gradient,
    Weight,
    check_all_reduce_options,
    check_bool,
    library_code,
    sparse_mode,
)
from towers.variables._names import Copies, names_of
from towers.variables._replica_checks import (
    check_own_model,
    check_same_structure,
    copy_first,
    replica_index,
    tower_scope,
)
from towers.variables._sharded import ShardedState
from towers.variables._shared_init import built_replicas
from towers.variables._strategy import ReducedGradients, VariableStrategy, trainable_list
from towers.workers import algorithm_for_workers


class Replicated(VariableStrategy):
    """One copy of a model per device; gradients all-reduced, the same update everywhere.

    Give a function that builds the model with its variables (call it on a sample if it
    creates them lazily); `Replicated` calls it once per device, under `tf.device`, and
    copies the first replica's values to the others (in a v1 graph each copy's initializer
    takes the first copy's initial value: one run of the initializers gives every copy the
    same values; across workers, run `broadcast()`'s op after it). Tower code takes its own
    copy with `local()`:
    `loss_fn(shard)` calls `replicas.local()(shard[0])` (docs/replicated.md).

    Every tower reads its local copy; `train_step` all-reduces the gradients and applies the
    same update to each copy, with optimizer state per copy (or sharded). Weight files see
    one copy under the first replica's names. Pass it as the model to `train_step`,
    `save_weights` and `CheckpointManager`: it holds its own copies.

    Args:
      build: Called with no argument once per device; returns a `tf.Module` whose
        variables exist.
      devices: The tower devices, distinct.
      all_reduce: The algorithm, a name from `ops.ALGORITHMS` or an `ops.AllReduce`.
      bucket_bytes: Gradient packing bucket size; None for one all-reduce per variable.
      wire_dtype: None, tf.float16 or tf.bfloat16 for compressed transfers.
      sparse: "gather" (IndexedSlices stay sparse, each row once), "dense", or "auto":
        "dense" on logical GPUs of one GPU or on one GPU alone (a table-sized gradient in
        its memory), "gather" elsewhere (`ops.internal.sparse_mode`).
      shard_optimizer_state: Keep each variable's optimizer state on one copy only (its
        owner; whole variables, balanced by bytes: `owners`): gradients are reduce-scattered
        to the owners, each owner updates its variables, and the updated values are
        all-gathered into every copy (docs/replicated.md, *Sharded optimizer state*).

    Raises:
      ValueError: if devices repeat or do not exist, an option is out of range, a replica has
        no variables, `build` returns a model (or variables) it returned before, or replicas
        differ in structure (the message names the variables).
      TypeError: if `build` is not callable or `devices` is a single name.

    Example:
      >>> replicas = towers.Replicated(build_model, devices)  # loss_fn uses replicas.local()
      >>> loss, _ = towers.train_step(loss_fn, replicas, towers.Adam(1e-3), batch, devices)
    """

    def __init__(
        self,
        build: Callable[[], tf.Module],
        devices: Sequence[str],
        *,
        all_reduce: str | ops.AllReduce = "auto",
        bucket_bytes: int | None = 64 * 2**20,
        wire_dtype: tf.DType | None = None,
        sparse: str = "auto",
        shard_optimizer_state: bool = False,
    ):
        if not callable(build) or isinstance(build, tf.Module):
            raise TypeError(
                f"`build` must be a function that builds a new model on each call, e.g. "
                f"`lambda: MyModel()`; got {type(build).__name__}."
            )
        self.devices = device_list(devices)
        if not self.devices or len(set(self.devices)) != len(self.devices):
            raise ValueError(f"`devices` must be distinct and non-empty; got {self.devices}.")
        check_devices_exist(self.devices)
        self.sparse = sparse_mode(sparse, self.devices)
        check_all_reduce_options(bucket_bytes, wire_dtype, self.sparse)
        self.algorithm = algorithm_for_workers(all_reduce)
        self.bucket_bytes, self.wire_dtype = bucket_bytes, wire_dtype
        self.replicas = built_replicas(build, self.devices)
        check_same_structure(self.replicas)
        self.shard_optimizer_state = check_bool(shard_optimizer_state, "shard_optimizer_state")
        self._sharded = None
        if shard_optimizer_state:
            self._sharded = ShardedState(self.variables_of(0), self.algorithm, len(self.devices))
        if tf.compat.v1.executing_eagerly_outside_functions():  # not in a v1 graph, whose
            self.broadcast()  # variables get values only in a session

    @library_code
    def local(self) -> tf.Module:
        """The current tower's replica (the first one outside towers).

        Returns:
          The model `build` made for this tower's device.

        Raises:
          ValueError: if the tower count differs from the number of replicas.
        """
        return self.replicas[self._index(current_tower())]

    @library_code
    def variables_of(self, index: int) -> list[tf.Variable]:
        """The trainable variables of replica `index`, aligned across replicas.

        Args:
          index: The replica (tower) index.

        Returns:
          Its trainable variables, in the order every replica shares.
        """
        return trainable_list(self.replicas[index])

    @property
    def owners(self) -> list[int] | None:
        """With sharded state, the owner of each of `variables_of(0)`; else None.

        An owner is a device's rank in the group (every worker's devices, in worker order).
        """
        return None if self._sharded is None else list(self._sharded.owners)

    def state_copies(self, model: Any = None) -> dict[str, tuple[tf.Variable | None, ...]]:
        """Every variable's copies that keep optimizer state: the owner's only when sharded.

        Args:
          model: This `Replicated`, or None.

        Returns:
          Canonical name -> for each replica, its copy or None.
        """
        copies = self.variable_copies(model)
        return copies if self._sharded is None else self._sharded.state_copies(copies)

    def after_update(self, model: Any, updates: list) -> list:
        """With sharded state, every copy takes the owners' updated values (all-gathered).

        Args:
          model: This `Replicated`.
          updates: The owners' updates, which the copies wait for.

        Returns:
          The assignments (none without sharding).
        """
        self._check_model(model)
        return [] if self._sharded is None else self._sharded.gather(self, updates)

    @library_code
    def variable_copies(self, model: Any = None) -> Copies:
        """Every variable's copies, first replica first, under the first replica's names.

        Args:
          model: This `Replicated` (it is its own model), or None.

        Returns:
          Canonical name -> (replica 0's variable, replica 1's, ...).
        """
        if model is not None:
            self._check_model(model)
        per_replica = [list(names_of(r).values()) for r in self.replicas]
        names = names_of(self.replicas[0])
        return {name: tuple(v[j] for v in per_replica) for j, name in enumerate(names)}

    def broadcast(self) -> tf.Operation | None:
        """Copies the first replica's values to the others: now, or the op in a v1 graph.

        Across workers (`towers.init_workers`), worker 0's first replica's values go to every
        replica of every worker. The constructor calls it eagerly; in a v1 graph, run the op
        it returns after the initializer, every worker at the same point (docs/porting.md).

        Returns:
          None eagerly; in a v1 graph, the op that copies.
        """
        return copy_first(list(self.variable_copies().values()), self.algorithm, self.devices)

    @library_code
    def all_reduce(
        self, tower_grads: list[list[Gradient]], weights: Sequence[Weight] | None = None
    ) -> list[list[Gradient]]:
        """All-reduces `K x N` tower gradients with this strategy's settings.

        Args:
          tower_grads: K lists of N gradients, tower i's for replica i.
          weights: K weights of the mean (shard sizes); None for the plain mean.

        Returns:
          K lists of N reduced gradients, list i on device i; all equal.
        """
        return ops.all_reduce_gradients(
            tower_grads,
            self.devices,
            weights=weights,
            algorithm=self.algorithm,
            bucket_bytes=self.bucket_bytes,
            wire_dtype=self.wire_dtype,
            sparse=self.sparse,
            variables=self.variables_of(0),
        )

    @library_code
    def scope(self, tower: TowerContext) -> contextlib.AbstractContextManager:
        """Checks the tower against the replicas; refuses variable creation in it.

        Args:
          tower: The tower being built: tower i must be on replica i's device.

        Returns:
          A `tf.variable_creator_scope` that raises: replicas are built up front.

        Raises:
          ValueError: if the towers are not built on the replicas' devices.
        """
        return tower_scope(tower, self.devices)

    def updates_state(self, tower: TowerContext) -> bool:
        """Every tower updates its own copy's state (see `towers.updates_state`)."""
        del tower
        return True

    @library_code
    def tower_variables(self, model: Any, tower: TowerContext | None) -> list[tf.Variable]:
        """The trainable variables of `tower`'s own replica (the first outside towers).

        Args:
          model: This `Replicated` (it is its own model).
          tower: The tower, or None.

        Returns:
          Replica i's trainable variables for tower i.

        Raises:
          ValueError: if `model` is another object, or the tower count differs from the
            number of replicas.
        """
        self._check_model(model)
        return self.variables_of(self._index(tower))

    @library_code
    def reduce_gradients(
        self,
        model: Any,
        tower_grads: list[list[Gradient]],
        weights: Sequence[Weight],
        *,
        every_gradient: bool = False,
    ) -> list[ReducedGradients]:
        """All-reduces the tower gradients: one update per replica, on its device.

        With sharded state, reduce-scatters them: replica i gets the gradients of the
        variables it owns (None for the others), unless `every_gradient` (for a hook).

        Args:
          model: This `Replicated`.
          tower_grads: K lists of N gradients, tower i's for replica i.
          weights: K weights (shard sizes).
          every_gradient: With sharded state, all-reduce all the same; each replica still
            updates only its own.

        Returns:
          K `ReducedGradients`, the i-th for replica i's variables on its device, bitwise
          equal where given, so the copies stay identical.
        """
        self._check_model(model)
        if self._sharded is not None:
            return self._sharded.reduce(self, tower_grads, weights, every_gradient)
        reduced = self.all_reduce(tower_grads, weights=weights)
        return [
            ReducedGradients(grads, self.variables_of(i), device)
            for i, (grads, device) in enumerate(zip(reduced, self.devices))
        ]

    def _index(self, tower: TowerContext | None) -> int:
        return replica_index(tower, len(self.replicas))

    def _check_model(self, model: Any) -> None:
        check_own_model(self, model)
