"""One device's whole step as one XLA program: its tower, the guard's verdict and the update.

With one tower there is nothing to reduce, so `train_step(..., jit_compile=True)` need not
stop between the tower's program and the update's: the forward and backward pass, the
check of every gradient (and of the rate), the update chosen by the verdict and the step
count are one program on the device, as a one-device `tf.function(jit_compile=True)` step
would be. The host only launches it; "raise"'s check reads the verdict it returns.

It applies where everything the program touches lives on the device and can be compiled:
one `Replicated` copy, a towers optimizer, no gradient hook (a user's hook may use ops XLA
lacks, such as `tf.unique` or a summary), no accumulation, no `LossScale` object (its
counts live on the host), one micro-batch, and a `tf.function` (a v1 graph's Grappler
rewrites ops of such a program into fused kernels XLA lacks, `_FusedMatMul`). Otherwise the
tower and the update are two programs, as on several devices.
"""

import dataclasses
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from towers.core import compiling
from towers.ops.internal import library_code, update_ops
from towers.optimizers import AppliesGradients, Optimizer
from towers.step._apply_reduced import reduced_updates
from towers.step._loss_scale import LossScale
from towers.step._nonfinite import Verdict
from towers.step._reduce import reduce_for
from towers.step._tower_builder import replicate
from towers.variables import Replicated, VariableStrategy, deferred_state_updates


def fits_one_program(
    strategy: VariableStrategy,
    devices: list[str],
    optimizer: AppliesGradients,
    *,
    jit_compile: bool,
    gradient_hook: Any,
    accumulate: Any,
    loss_scale: Any,
    micro_batches: int,
) -> bool:
    """Whether `train_step`'s tower and update can be one XLA program (see the module)."""
    return (
        jit_compile
        and tf.compat.v1.executing_eagerly_outside_functions()  # (not in a v1 graph)
        and len(devices) == 1
        and isinstance(strategy, Replicated)
        and len(strategy.devices) == 1
        and isinstance(optimizer, Optimizer)
        and gradient_hook is None
        and accumulate is None
        and not isinstance(loss_scale, LossScale)
        and micro_batches == 1
    )


@library_code
def one_program(
    tower_fn: Callable[[Any], tuple],
    shard: Any,
    device: str,
    strategy: VariableStrategy,
    variables: Any,
    optimizer: Optimizer,
    *,
    sizes: list,
    loss_scale: Any,
    nonfinite: str | None,
    check_some_gradient: Callable[[list], None],
) -> tuple[tf.Tensor, Any, list, Verdict]:
    """The one tower's pass, its verdict and its update, as one XLA program on `device`.

    Args:
      tower_fn: `tower_gradients` of the step, uncompiled (the program compiles it).
      shard: The tower's inputs (the whole batch).
      device: The tower's device.
      strategy: The one-copy `Replicated`.
      variables: The model given to `train_step` (the strategy itself).
      optimizer: The towers optimizer.
      sizes: The shard's size, in a list.
      loss_scale: None or a number.
      nonfinite: The resolved mode.
      check_some_gradient: Refuses gradients that are all None (while tracing).

    Returns:
      `(loss, outputs, updates, verdict)`: the tower's loss and outputs, the program's call
      (in a list: what the step waits for) and the verdict, its tensors the program's outputs.
    """
    built: dict[str, Verdict] = {}

    def program(shard: Any) -> dict:
        with deferred_state_updates() as state_updates:  # (BatchNorm's): to the verdict
            ((loss, outputs, grads),) = replicate(
                tower_fn, [shard], [device], variable_strategy=strategy
            )
        check_some_gradient(grads)
        reduced = reduce_for(strategy, variables, [grads], sizes, None)
        updates, verdict = reduced_updates(
            reduced,
            optimizer,
            loss_scale=loss_scale,
            nonfinite=nonfinite,
            batch_size=sizes[0],
            state_updates=state_updates,
        )
        built["verdict"] = verdict
        with tf.control_dependencies(update_ops(updates)):
            return {
                "loss": tf.identity(loss),
                "outputs": tf.nest.map_structure(_identity, outputs),
                "finite": tf.constant(True) if verdict.finite is None else verdict.finite,
                "flags": [tf.identity(flag) for flag in verdict.flags],
            }

    function = tf.function(program, jit_compile=True, autograph=False)
    with tf.device(device), compiling():
        concrete = function.get_concrete_function(shard)
    with tf.device(device):
        out = concrete(shard)
    verdict = built["verdict"]
    if verdict.finite is not None:
        verdict = dataclasses.replace(
            verdict, finite=out["finite"], flags=tuple(out["flags"]), copies=(), devices=()
        )
    return out["loss"], out["outputs"], [out["finite"]], verdict


def _identity(value: Any) -> Any:
    return None if value is None else tf.identity(value)
