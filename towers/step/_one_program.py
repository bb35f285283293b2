"""One device, compiled: the tower, the guard and the update as one XLA program.

With one tower there is nothing to reduce, so `train_step(..., jit_compile=True)` on one
device runs the tower's forward and backward pass, the verdict on its gradients and the
optimizer's update (each write chosen by the verdict) as one program on the device: what
`tf.function(jit_compile=True)` around a whole single-device step compiles, with the guard
inside. Two programs (the tower's, then the update's) cost the gradients a round trip through
device memory and the update its own launch (issue #32: 1.09x the whole step compiled, two
programs, on the H200).

Where the step needs what cannot be inside one program, it keeps the two: a gradient hook
(user code: it may log or summarize), a loss scale (its state on the host), accumulation (its
`tf.cond` on the call count), micro-batches, sharded state, other workers, a user's own
optimizer, a strategy of the user's (its `reduce_gradients` may change the gradients even
for one tower), or trained variables off the tower's device (a parameter server's on the CPU).
"""

import dataclasses
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from towers.core import current_tower
from towers.ops.internal import library_code, update_ops
from towers.optimizers import AppliesGradients, Optimizer
from towers.step._apply_reduced import reduced_updates
from towers.step._compiled import local_device
from towers.step._tower_builder import replicate
from towers.step._tower_gradients import check_some_gradient, tower_gradients
from towers.step._verdict import Verdict
from towers.variables import (
    ParameterServer,
    ReducedGradients,
    Replicated,
    VariableStrategy,
    deferred_state_updates,
)
from towers.workers import current_workers


def fits_one_program(
    strategy: VariableStrategy,
    variables: Any,
    devices: list[str],
    optimizer: AppliesGradients,
    *,
    jit_compile: bool,
    hooked: bool,
    scaled: bool,
    accumulating: bool,
    micro_batches: int,
) -> bool:
    """Whether the step can be one program: one tower, compiled, and nothing that needs two."""
    if not jit_compile or len(devices) != 1 or hooked or scaled or accumulating:
        return False
    if micro_batches != 1 or not isinstance(optimizer, Optimizer):
        return False
    if type(strategy) not in (Replicated, ParameterServer):  # whose one-tower reduction is
        return False  # the gradients as they are; a strategy of the user's reduces as it says
    if strategy.shard_optimizer_state or current_workers().num_workers != 1:
        return False
    try:
        trained = strategy.tower_variables(variables, None)
    except ValueError:  # none yet (a model that builds its variables when first called)
        return False
    device = local_device(devices[0])
    return bool(trained) and all(local_device(var.device) == device for var in trained)


@library_code
def one_program_step(
    loss_fn: Callable[[Any], Any],
    variables: Any,
    optimizer: Optimizer,
    shard: Any,
    size: Any,
    device: str,
    *,
    strategy: VariableStrategy,
    nonfinite: str | None,
    merge: Any,
) -> tuple[tf.Tensor, Any, list, Verdict]:
    """The step's loss, outputs, update and verdict, from one program on `device`.

    Returns:
      `(loss, outputs, updates, verdict)`: the tower's loss and outputs (after the update),
      the program's run as the one update, and the verdict on the program's outputs (for
      "raise"'s check outside it, on the host).
    """
    traced: dict[str, Verdict] = {}

    def whole(inputs: Any) -> tuple:
        with deferred_state_updates() as state_updates:  # under the verdict, in the program
            loss, outputs, grads = tower_gradients(
                loss_fn, variables, inputs, variable_strategy=strategy, merge=merge
            )
        trained = strategy.tower_variables(variables, current_tower())
        check_some_gradient(grads, trained)
        reduced = [ReducedGradients(list(grads), list(trained), device)]  # one tower: as is
        updates, verdict = reduced_updates(
            reduced,
            optimizer,
            nonfinite=nonfinite,
            batch_size=size,
            state_updates=state_updates,
            jit_compile=True,  # (the update's program inlined into this one)
        )
        traced["verdict"] = verdict
        with tf.control_dependencies(update_ops(updates)):
            finite = tf.identity(verdict.chosen)
            flags = [tf.identity(flag) for flag in verdict.flags]
            loss = tf.identity(loss)
        return loss, outputs, finite, flags

    (result,) = replicate(whole, [shard], [device], variable_strategy=strategy, jit_compile=True)
    loss, outputs, finite, flags = result
    verdict = traced["verdict"]
    if verdict.mode is not None:
        verdict = dataclasses.replace(verdict, finite=finite, flags=tuple(flags), copies=())
    return loss, outputs, [finite], verdict
