"""The replicated variable strategy: one copy of the model per tower device, kept identical."""

import contextlib
from collections.abc import Callable, Sequence

import numpy as np

import ops
from ops._tensorflow import tf
from towers._context import TowerContext, current_tower
from towers._devices import canonical_device
from towers._named import named_variables, variable_copies


class Replicated:
    """One copy of a model per device; gradients all-reduced, the same update everywhere.

    The one way to write a model for this strategy: give a function that builds the model
    with its variables (call it on a sample if it creates them lazily); `Replicated` calls it
    once per device, under `tf.device`, and copies the first replica's values to the others.
    Tower code takes its own copy with `local()`:

        replicas = towers.Replicated(lambda: build_model(), devices)

        def loss_fn(shard):
            logits = replicas.local()(shard["x"])     # this tower's copy, on its device
            ...

        towers.train_step(loss_fn, replicas, towers.SGD(0.1), batch, devices)

    Every tower reads its local copy, so no variable crosses devices in the forward pass;
    `train_step` all-reduces the gradients (`ops.all_reduce_gradients`) and applies the same
    update to each copy, with optimizer state per copy. Weight files see one copy, with the
    first replica's names: `save_weights(replicas, path)` writes it and `restore_weights`
    loads it into every copy.

    Args:
      build: Called with no argument once per device; returns a `tf.Module` whose
        variables exist.
      devices: The tower devices, distinct.
      all_reduce: The algorithm, a name from `ops.ALGORITHMS` or an `ops.AllReduce`.
      bucket_bytes: Gradient packing bucket size; None for one all-reduce per variable.
      wire_dtype: None, tf.float16 or tf.bfloat16 for compressed transfers.
      sparse: "gather" (IndexedSlices stay sparse) or "dense".

    Raises:
      ValueError: if devices repeat, a replica has no variables, or replicas differ in
        structure (the message names the variables).
    """

    def __init__(
        self,
        build: Callable[[], tf.Module],
        devices: Sequence[str],
        *,
        all_reduce: str | ops.AllReduce = "auto",
        bucket_bytes: int | None = 4 * 2**20,
        wire_dtype: tf.DType | None = None,
        sparse: str = "gather",
    ):
        self.devices = [canonical_device(d) for d in devices]
        if not self.devices or len(set(self.devices)) != len(self.devices):
            raise ValueError(f"`devices` must be distinct and non-empty; got {self.devices}.")
        self.algorithm = ops.all_reduce_algorithm(all_reduce)
        self.bucket_bytes, self.wire_dtype, self.sparse = bucket_bytes, wire_dtype, sparse
        self.replicas = []
        for i, device in enumerate(self.devices):
            scope = tf.name_scope(f"replica_{i}") if i else contextlib.nullcontext()
            with tf.device(device), scope:
                self.replicas.append(build())
        self._check_structure()
        self.broadcast()

    @tf.autograph.experimental.do_not_convert
    def local(self) -> tf.Module:
        """The current tower's replica (the first one outside towers).

        Raises:
          ValueError: if the tower count differs from the number of replicas.
        """
        tower = current_tower()
        if tower is None:
            return self.replicas[0]
        if tower.num_towers != len(self.replicas):
            raise ValueError(
                f"{len(self.replicas)} replicas cannot serve {tower.num_towers} towers; build "
                "the towers on the devices of the Replicated."
            )
        return self.replicas[tower.index]

    @tf.autograph.experimental.do_not_convert
    def variables_of(self, index: int) -> list[tf.Variable]:
        """The trainable variables of replica `index`, aligned across replicas."""
        return list(self.replicas[index].trainable_variables)

    @tf.autograph.experimental.do_not_convert
    def variable_copies(self) -> dict[str, tuple[tf.Variable, ...]]:
        """Every variable's copies, first replica first, under the first replica's names."""
        per_replica = [list(named_variables(r).values()) for r in self.replicas]
        names = named_variables(self.replicas[0])
        return {name: tuple(v[j] for v in per_replica) for j, name in enumerate(names)}

    def broadcast(self) -> None:
        """Copies the first replica's values to the others (eagerly)."""
        for copies in self.variable_copies().values():
            for copy in copies[1:]:
                copy.assign(copies[0])

    @tf.autograph.experimental.do_not_convert
    def all_reduce(self, tower_grads: list, weights=None) -> list[list]:
        """All-reduces `K x N` tower gradients with this strategy's settings."""
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

    def scope(self, tower: TowerContext):
        """Refuses variable creation in towers: replicas are built up front."""

        def refuse(next_creator, **kwargs):
            raise ValueError(
                f"Tower {tower.index} created variable {kwargs.get('name')!r}; with Replicated "
                "every variable must exist when the Replicated is built. Build the model "
                "completely in `build` (e.g. call it once on a sample)."
            )

        return tf.variable_creator_scope(refuse)

    def _check_structure(self) -> None:
        first = {n: (v.shape, v.dtype) for n, v in named_variables(self.replicas[0]).items()}
        if not first:
            raise ValueError(
                "`build` returned a model without variables; build them in "
                "`build` (e.g. call the model once on a sample)."
            )
        for i, replica in enumerate(self.replicas[1:], start=1):
            other = {n: (v.shape, v.dtype) for n, v in named_variables(replica).items()}
            differ = sorted(n for n in first.keys() | other.keys() if first.get(n) != other.get(n))
            if differ:
                raise ValueError(
                    f"Replica {i} differs from replica 0 in variables {differ}; `build` must "
                    "build the same model every time."
                )


def check_replicas_identical(target) -> None:
    """Checks that every copy of every variable equals the first, bit for bit (eagerly).

    Args:
      target: A `Replicated`, or anything with `variable_copies()` such as `towers.SGD`
        (its momentum per replica); a plain target trivially passes.

    Raises:
      ValueError: naming each variable whose copies differ, the replicas and the largest
        difference.
    """
    differ = []
    for name, copies in variable_copies(target).items():
        first = copies[0].numpy()
        for i, copy in enumerate(copies[1:], start=1):
            value = copy.numpy()
            if not np.array_equal(first, value):
                gap = float(np.max(np.abs(value.astype(np.float64) - first)))
                differ.append(f"{name} (replica {i}, max difference {gap:.3g})")
    if differ:
        raise ValueError(f"Replicated copies differ: {', '.join(differ)}.")
