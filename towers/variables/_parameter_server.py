"""The parameter-server variable strategy: one copy of each variable, on chosen devices."""

import contextlib
import functools
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

import towers.ops as ops
from towers.core import TowerContext, canonical_device, check_devices_exist, device_list
from towers.ops.internal import Gradient, Weight, check_bucket_bytes, library_code
from towers.variables._names import Copies, names_of, without_tower_scope
from towers.variables._strategy import ReducedGradients, VariableStrategy, trainable_list
from towers.workers import current_workers

BUCKET_BYTES = 64 << 10  # pack the small gradients; a large one costs a transfer anyway


class ParameterServer(VariableStrategy):
    """One copy of each variable, on parameter devices; every tower reads that copy.

    Variables created in a tower are placed on a parameter device, not the tower's.

    With one device (the CPU by default) every variable lives there. With several, each new
    variable goes to the device holding the fewest bytes so far (greedy by size), which spreads
    a model over the tower devices. Gradients are averaged where each variable lives.

    Variable names carry no tower scope: "tower_0/dense/w" is created as "dense/w", the name a
    single-device program gives it. Only the first tower may create variables; later towers
    reuse them. A later tower that creates one is an error naming it (usually a model that
    builds a new layer per call).

    Args:
      devices: One device name, or a list of them to spread variables over.
      bucket_bytes: Each tower sends its dense gradients to a variable device in packed
        buffers of at most this many bytes (`ops.average_gradients(bucket_bytes=)`); a
        gradient larger than that crosses alone. The default, 64 KiB, packs what is small:
        a model of many small variables sends a few buffers per tower instead of one
        tensor per variable. None sends each gradient alone.

    Raises:
      ValueError: if `devices` is empty or a name does not parse, or `bucket_bytes` is not a
        positive int or None; when towers are built (TF2), if a device does not exist in
        this process.

    Example:
      >>> strategy = towers.ParameterServer(devices=towers.list_devices())
      >>> towers.train_step(loss_fn, model, optimizer, batch, devices,
      ...                   variable_strategy=strategy)
    """

    def __init__(
        self, devices: str | Sequence[str] = "/cpu:0", *, bucket_bytes: int | None = BUCKET_BYTES
    ):
        check_bucket_bytes(bucket_bytes)
        self.bucket_bytes = bucket_bytes
        one = isinstance(devices, (str, tf.DeviceSpec, tf.config.LogicalDevice))
        names = [canonical_device(devices)] if one else device_list(devices)  # not []
        self._load = dict.fromkeys(names, 0)

    @property
    def devices(self) -> list[str]:
        """The parameter devices, canonical names."""
        return list(self._load)

    def load(self) -> dict[str, int]:
        """Bytes of variables this strategy has placed on each device.

        Returns:
          Device name -> bytes, in the order of `devices`.
        """
        return dict(self._load)

    @library_code
    def scope(self, tower: TowerContext) -> contextlib.AbstractContextManager:
        """A scope in which variables created by `tower` are placed by this strategy.

        Only the first tower may create variables; they lose the tower's name scope.

        Args:
          tower: The tower being built.

        Returns:
          A `tf.variable_creator_scope`.
        """
        if tower.is_chief:
            check_devices_exist(self.devices, "ParameterServer(devices=...)")
        return tf.variable_creator_scope(functools.partial(self._create, tower))

    @library_code
    def tower_variables(self, model: Any, tower: TowerContext | None) -> list[tf.Variable]:
        """The model's trainable variables, the same for every tower.

        Args:
          model: A `tf.Module` (its trainable variables) or a list of variables.
          tower: Ignored: every tower reads the one copy.

        Returns:
          The variables, as a list.

        Raises:
          ValueError: if there are none.
        """
        del tower
        return trainable_list(model)

    @library_code
    def reduce_gradients(
        self,
        model: Any,
        tower_grads: list[list[Gradient]],
        weights: Sequence[Weight],
        *,
        every_gradient: bool = False,
    ) -> list[ReducedGradients]:
        """The weighted mean of the tower gradients, built where each variable lives.

        Args:
          model: A `tf.Module` or a list of variables.
          tower_grads: K lists of N gradients.
          weights: K weights (shard sizes).
          every_gradient: Ignored: the one copy updates every variable.

        Returns:
          One `ReducedGradients`: the averaged gradients of the single copy.

        Raises:
          ValueError: across several workers (each would train its own copy, apart).
        """
        del every_gradient
        if current_workers().num_workers > 1:
            raise ValueError(
                f"The parameter-server strategy keeps one copy in this process; with "
                f"{current_workers().num_workers} workers each would train its own copy, apart. "
                "Across workers use towers.Replicated(build, towers.list_devices()): its "
                "all-reduce spans every worker's devices."
            )
        variables = trainable_list(model)
        grads = ops.average_gradients(
            tower_grads, weights=weights, variables=variables, bucket_bytes=self.bucket_bytes
        )
        return [ReducedGradients(grads, variables)]

    def sends_narrow(self, num_towers: int) -> bool:
        """Two towers whose gradients travel packed (one by one they travel in float32)."""
        return super().sends_narrow(num_towers) and self.bucket_bytes is not None

    def variable_copies(self, model: Any) -> Copies:
        """One copy of each variable: the model's own, under its canonical names.

        Args:
          model: A `tf.Module`, a list or a dict of variables.

        Returns:
          Canonical name -> (the variable,).
        """
        return {name: (var,) for name, var in names_of(model).items()}

    def _create(self, tower: TowerContext, next_creator, **kwargs) -> tf.Variable:
        if not tower.is_chief:
            raise ValueError(
                f"Tower {tower.index} created variable {kwargs.get('name')!r}; only the first "
                "tower may create variables, later towers must reuse them. Build layers once "
                "(e.g. in the model's constructor or on its first call), not on every call."
            )
        kwargs, size = _with_size(kwargs)
        device = min(self._load, key=self._load.get)
        self._load[device] += size
        with tf.device(device), without_tower_scope(tower):
            return next_creator(**kwargs)


def _with_size(kwargs: dict) -> tuple[dict, int]:
    """The variable's size in bytes, evaluating a callable initial value if needed."""
    value = kwargs.get("initial_value")
    shape = kwargs.get("shape")
    if callable(value):
        value = value()
        kwargs = {**kwargs, "initial_value": value}
    if shape is None or not tf.TensorShape(shape).is_fully_defined():
        shape = getattr(value, "shape", tf.TensorShape(None))
    dtype = tf.as_dtype(kwargs.get("dtype") or getattr(value, "dtype", tf.float32))
    shape = tf.TensorShape(shape)
    return kwargs, (shape.num_elements() or 0) * dtype.size
