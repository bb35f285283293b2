"""Building one tower per device, each in its variable strategy's scope."""

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

import towers.ops as ops
from towers.core import (
    TowerContext,
    as_caller_would,
    check_devices_exist,
    current_tower,
    device_list,
    examples_from,
    user_code_entry,
)
from towers.ops.internal import library_code
from towers.step._compiled import CompiledTower, check_jit_compile
from towers.variables import ParameterServer, VariableStrategy


@user_code_entry
def replicate(
    fn: Callable[[Any], Any],
    shards: Sequence[Any],
    devices: Sequence[str],
    *,
    variable_strategy: VariableStrategy | None = None,
    jit_compile: bool = False,
) -> list[Any]:
    """Calls `fn(shard)` once per tower, each on its own device, and returns the results.

    Tower i is built under `tf.device(devices[i])`, `tf.name_scope(f"tower_{i}")`, a
    `TowerContext` (see `current_tower()`) and the variable strategy's scope, with `shards[i]`
    as the argument. Tower 0 is built first and creates the variables; the others reuse them.

    Args:
      fn: The tower function, called with one shard.
      shards: One input per tower, e.g. from `ops.split_batch`.
      devices: One device per tower, e.g. from `towers.list_devices()`.
      variable_strategy: A `towers.VariableStrategy` (`ParameterServer`, `Replicated`...);
        default a `ParameterServer` on the CPU.
      jit_compile: Compile each tower's `fn` with XLA, one program per tower on its device
        (see docs/compiled.md). Its results carry no gradient back into the tower: take
        gradients inside `fn` (as `towers.tower_gradients` does).

    Returns:
      The K results of `fn`, in tower order.

    Raises:
      ValueError: if `shards` and `devices` differ in length or are empty, a device does not
        exist, or a tower after the first creates a variable.
      TypeError: if `fn` is not callable, `devices` is a single name rather than a list,
        `variable_strategy` is not a strategy, or `jit_compile` not a bool.
      RuntimeError: if called inside a tower.

    Example:
      >>> shards = ops.split_batch(batch, len(devices))
      >>> losses = towers.replicate(model_loss, shards, devices)
    """
    if not callable(fn):
        raise TypeError(f"`fn` must be callable; got {fn!r}.")
    shards, devices = list(shards), device_list(devices)
    if not devices or len(shards) != len(devices):
        raise ValueError(
            f"`shards` and `devices` must be non-empty and of the same length (one shard per "
            f"tower); got {len(shards)} shards and {len(devices)} devices."
        )
    if current_tower() is not None:
        raise RuntimeError("towers.replicate was called inside a tower; towers do not nest.")
    check_devices_exist(devices)
    strategy = resolve_strategy(None, variable_strategy)
    jit_compile = check_jit_compile(jit_compile)
    fn = as_caller_would(fn)
    results = []
    for i, (shard, device) in enumerate(zip(shards, devices)):
        with tf.device(device), tf.name_scope(f"tower_{i}") as scope:
            context = TowerContext(i, device, len(devices), scope, strategy, tuple(devices))
            with context as tower, strategy.scope(tower), examples_from(_offset(shards, i)):
                results.append(CompiledTower(fn, tower)(shard) if jit_compile else fn(shard))
    return results


def _offset(shards: list, i: int):
    """The sizes of the shards before shard i, computed when something reads them."""
    return lambda: [ops.shard_sizes(shard, 1)[0] for shard in shards[:i]]


@library_code
def resolve_strategy(model: Any, variable_strategy: VariableStrategy | None) -> VariableStrategy:
    """The strategy for `model`: the model itself if it is one, else the given or the default.

    Args:
      model: The variables to train; a strategy holding its own copies (`Replicated`) is its
        own strategy. None when only the strategy matters.
      variable_strategy: The strategy asked for, or None: inside a tower, the one the tower
        is built with; outside, a new `ParameterServer` on the CPU.

    Returns:
      A `VariableStrategy`.

    Raises:
      TypeError: if `variable_strategy` is not a strategy.
    """
    if variable_strategy is not None and not isinstance(variable_strategy, VariableStrategy):
        raise TypeError(
            "`variable_strategy` must be a towers.VariableStrategy such as "
            f"towers.ParameterServer() (subclass it for a strategy of your own); got "
            f"{type(variable_strategy).__name__}."
        )
    if isinstance(model, VariableStrategy):
        if variable_strategy is not None and variable_strategy is not model:
            warnings.warn(
                f"variable_strategy={type(variable_strategy).__name__}(...) is ignored: the "
                f"model is a {type(model).__name__}, its own variable strategy.",
                stacklevel=3,
            )
        return model
    if variable_strategy is not None:
        return variable_strategy
    tower = current_tower()
    if tower is not None and tower.variable_strategy is not None:
        return tower.variable_strategy
    return ParameterServer()
