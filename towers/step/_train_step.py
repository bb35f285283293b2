"""A whole data-parallel training step, as a thin composition of the library's stages."""

import functools
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

import towers.ops as ops
from towers.core import current_tower, device_list, user_code_entry
from towers.data import StagedInput
from towers.ops.internal import library_code
from towers.optimizers import AppliesGradients, Optimizer, is_keras
from towers.step._accumulator import GradientAccumulator
from towers.step._apply_reduced import GradientHook, reduced_updates
from towers.step._compiled import check_jit_compile
from towers.step._loss_scale import LossScale, as_loss_scale
from towers.step._micro_batches import check_micro_batches
from towers.step._nonfinite import checked_loss, resolve, writes_choose
from towers.step._one_program import fits_one_program, one_program_step
from towers.step._reduce import reduce_for
from towers.step._tower_builder import replicate, resolve_strategy
from towers.step._tower_gradients import Variables, check_some_gradient, tower_gradients
from towers.variables import VariableStrategy, deferred_state_updates


@library_code
def variable_list(
    variables: Variables, *, variable_strategy: VariableStrategy | None = None
) -> list[tf.Variable]:
    """The variables the current tower trains (the first copy's outside towers).

    Args:
      variables: A sequence of `tf.Variable`, a `tf.Module` (its trainable variables), or a
        strategy holding its own copies such as `Replicated` (the current tower's copy).
      variable_strategy: As in `train_step`; inside a tower, default the tower's.

    Returns:
      The variables, as a list.

    Raises:
      ValueError: if there are none, or something else than a variable is among them.
    """
    strategy = resolve_strategy(variables, variable_strategy)
    return strategy.tower_variables(variables, current_tower())


@user_code_entry
def train_step(
    loss_fn: Callable[[Any], Any],
    variables: Variables,
    optimizer: AppliesGradients,
    inputs: Any,
    devices: Sequence[str],
    *,
    gradient_hook: GradientHook | None = None,
    merge: str | Any = "concat",
    variable_strategy: VariableStrategy | None = None,
    split_device: str | None = "/cpu:0",
    merge_device: str | None = "/cpu:0",
    loss_scale: LossScale | float | None = None,
    nonfinite: str | None = "default",
    micro_batches: int = 1,
    accumulate: GradientAccumulator | None = None,
    jit_compile: bool = False,
) -> tuple[tf.Tensor, Any]:
    """Splits `inputs`, builds one tower per device, reduces the gradients and applies them.

    The result equals one device's step on the whole batch: tower gradients are weighted by
    shard size, so uneven batches are exact. The body is a few public calls; copy them into
    your loop to change any stage.

    Args:
      loss_fn: Called once per tower with its shard; returns the mean loss over the shard, or
        `(loss, outputs)`.
      variables: The variables to train: a `tf.Module` whose trainable variables are used,
        a list of variables, or a strategy holding its own copies of the model
        (`towers.Replicated`: one copy per device, gradients all-reduced).
      optimizer: Anything with `apply_gradients`, e.g. `towers.SGD(0.1)`.
      inputs: The whole batch, a nested structure of tensors, or a `towers.StagedInput`
        (`prefetch_to_devices`: shards already on the devices; each call takes a batch).
      devices: One device per tower.
      gradient_hook: Called as `hook(grads, variables)` with the reduced gradients of each
        copy of the variables (once with a parameter server, once per replica with
        `Replicated`); returns the gradients to apply (clip, mask, log). None gradients may
        stay None. It must treat every copy alike to keep replicas identical. A gradient is
        a dense tensor or `tf.IndexedSlices` with each row once (repeated rows summed), so
        `tf.clip_by_global_norm` measures the true norm; with `accumulate`, always dense.
      merge: How to merge the outputs, as `ops.merge_outputs`'s `mode`.
      variable_strategy: A `towers.VariableStrategy` for a model that does not hold its own
        copies; default `towers.ParameterServer()` (variables on the CPU). Ignored, with a
        warning, when `variables` is itself a strategy (`Replicated`).
      split_device: Where the batch is split.
      merge_device: Where the losses and outputs are merged.
      micro_batches: Run each tower's shard as this many parts in sequence (the memory of
        one part), their gradients averaged by size before the reduction: the same step.
      accumulate: A `towers.GradientAccumulator`: update every `accumulate.every` calls,
        with the exact mean gradient of their batches (the hook sees that mean). A call
        the guard stops (its gradients, or the mean it would apply) adds nothing to the sums.
      jit_compile: Compile with XLA: each tower's forward and backward pass, one program
        per tower on its device, and each device's update (a towers optimizer over that
        copy's variables, the non-finite choice inside), one program per device; the
        reduction stays outside (see docs/compiled.md). On one device, with nothing that
        needs the two (a hook, a loss scale, `accumulate`, micro-batches, sharded state,
        workers, a strategy of your own, variables off the device), the tower, the verdict
        and the update are one program. A user's own optimizer (anything else with
        `apply_gradients`) runs uncompiled.
      loss_scale: For half-precision compute: a number (a fixed scale), a `towers.LossScale`
        (fixed, counting skipped steps) or a `towers.DynamicLossScale`. Each tower
        differentiates its loss times the scale; the reduced gradients are divided by it
        before the hook; a step whose gradients are not all finite is skipped by every
        copy. The returned loss is not scaled.
      nonfinite: What a NaN or Inf gradient (or learning rate) does: "raise" (the default
        without a loss scale: the step changes nothing and the call fails with an error
        naming the variables; a `LossScale` counts nothing), "skip" (the default with one:
        the step changes nothing, optimizer state and moving averages included; counted by
        a `LossScale` object) or None (no check). Decided on the devices: no update waits
        for the host.

    Returns:
      `(loss, outputs)`: the mean loss over the whole batch (evaluating it in a v1 Session
      runs the update too) and the merged outputs (None if `loss_fn` returns only a loss).

    Raises:
      ValueError: for bad inputs (see `ops.split_batch`, `towers.replicate`), a
        `StagedInput` staged on other devices than `devices`, a loss that is not a scalar,
        a loss from which no variable gets a gradient, a hook returning the wrong number
        of gradients (see `apply_reduced`), `micro_batches` < 1, a `loss_scale` number that
        is not positive, an unknown `nonfinite` (or one other than "skip" with a
        `DynamicLossScale`), or a `gradient_hook` with `accumulate` when the strategy
        shards optimizer state.
      TypeError: if `variable_strategy` is not a strategy, `gradient_hook` is not callable,
        `accumulate` is not a `towers.GradientAccumulator`, `loss_scale` is neither a
        number nor a `towers.LossScale`, `micro_batches` is not an int, or `jit_compile`
        is not a bool.

    Example:
      >>> devices = towers.list_devices()
      >>> model, optimizer = MyModel(), towers.SGD(0.1, momentum=0.9)
      >>> def loss_fn(shard):
      ...     images, labels = shard
      ...     logits = model(images)
      ...     loss = tf.reduce_mean(
      ...         tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))
      ...     return loss, logits  # the shard's mean loss, and outputs to merge
      >>> @tf.function
      ... def step(batch):
      ...     return towers.train_step(loss_fn, model, optimizer, batch, devices)
      >>> loss, logits = step((images, labels))  # the whole batch's mean loss and logits
    """
    strategy = resolve_strategy(variables, variable_strategy)
    devices = device_list(devices)
    jit_compile = check_jit_compile(jit_compile)
    loss_scale = as_loss_scale(loss_scale)
    nonfinite = resolve(nonfinite, loss_scale)
    if gradient_hook is not None and not callable(gradient_hook):
        raise TypeError(f"`gradient_hook` must be callable; got {gradient_hook!r}.")
    shards, sizes, staging = _shards(inputs, devices, split_device)
    micro_batches = check_micro_batches(micro_batches)
    if fits_one_program(
        strategy,
        variables,
        devices,
        optimizer,
        jit_compile=jit_compile,
        hooked=gradient_hook is not None,
        scaled=loss_scale is not None,
        accumulating=accumulate is not None,
        micro_batches=micro_batches,
    ):  # one tower, nothing to reduce: the tower, the guard and the update in one program
        _prepare(optimizer, strategy, variables, 1)
        loss, output, updates, verdict = one_program_step(
            loss_fn,
            variables,
            optimizer,
            shards[0],
            sizes[0],
            devices[0],
            strategy=strategy,
            nonfinite=nonfinite,
            merge=merge,
        )
        losses, outputs, reduced, chosen_inside = [loss], [output], [], False
    else:
        tower_fn = functools.partial(
            tower_gradients,
            loss_fn,
            variables,
            variable_strategy=strategy,
            loss_scale=loss_scale,
            micro_batches=micro_batches,
            merge=merge,
            jit_compile=jit_compile,
        )
        with ops.collective_order():  # v1 graphs: the step's exchanges and all-reduces, in order
            with deferred_state_updates() as state_updates:  # (BatchNorm's): to the verdict
                per_tower = replicate(tower_fn, shards, devices, variable_strategy=strategy)
            losses, outputs, tower_grads = (list(column) for column in zip(*per_tower))
            trained = variable_list(variables, variable_strategy=strategy)
            check_some_gradient(tower_grads[0], trained)
            reduced = reduce_for(strategy, variables, tower_grads, sizes, gradient_hook)
        _prepare(optimizer, strategy, variables, len(reduced))
        if accumulate is not None and not isinstance(accumulate, GradientAccumulator):
            raise TypeError(
                "`accumulate` must be a towers.GradientAccumulator; got "
                f"{type(accumulate).__name__}."
            )
        if accumulate is not None:
            _check_accumulation(strategy, gradient_hook)
            accumulate.build(strategy.state_copies(variables))
        updates, verdict = reduced_updates(
            reduced,
            optimizer,
            gradient_hook,
            loss_scale=loss_scale,
            nonfinite=nonfinite,
            accumulate=accumulate,
            batch_size=_total(sizes),
            state_updates=state_updates,
            jit_compile=jit_compile,
            after=staging,
        )
        chosen_inside = writes_choose(
            optimizer, jit_compile, state_updates, accumulate, loss_scale, reduced, gradient_hook
        )
    loss = ops.merge_outputs(losses, "mean", weights=sizes, device=merge_device)
    if outputs[0] is not None:
        outputs = ops.merge_outputs(outputs, merge, weights=sizes, device=merge_device)
    else:
        outputs = None
    with ops.collective_order():  # (sharded state: the all-gather, chained on its own)
        after = strategy.after_update(variables, updates)
    updates += after
    # "raise": after every transfer and merge of the step, so that when it fails nothing of
    # the step still crosses between devices (no exchange is cancelled: no TensorFlow noise
    # around it); and after every write, unless each is a program that chooses for itself
    # and the step has copies (a parameter server's updates cut its transfers, CPU probe) or
    # is one uncompiled copy updated by one program on its GPU (`writes_choose`).
    early = chosen_inside and not after and (len(reduced) > 1 or not jit_compile)
    exchanged = [copy.grads for copy in reduced] if early else None
    return checked_loss(verdict, updates, loss, outputs, exchanged, staging), outputs


def _shards(inputs: Any, devices: list[str], split_device: str | None) -> tuple[list, list, list]:
    """Each tower's shard, the shard sizes, and the staging of the next batch (staged input).

    Split now, or staged on the devices already (then the step stages the next batch).
    """
    if not isinstance(inputs, StagedInput):
        shards = ops.split_batch(inputs, len(devices), device=split_device)
        return shards, ops.shard_sizes(inputs, len(devices)), []
    if inputs.devices != devices:
        raise ValueError(
            f"The staged input is staged on {inputs.devices}, and the towers are built on "
            f"{devices}; give towers.prefetch_to_devices the step's devices."
        )
    staging: list = []
    return (*inputs.take(staging=staging), staging)


def _check_accumulation(strategy: VariableStrategy, gradient_hook: Any) -> None:
    """Sharded state accumulates each copy's share: a hook would see a part of the mean."""
    if gradient_hook is not None and strategy.shard_optimizer_state:
        raise ValueError(
            "With shard_optimizer_state=True and `accumulate`, each copy accumulates only its "
            "own variables' gradients, so a gradient hook would see a part of the accumulated "
            "mean (a global norm of it would be wrong). Drop the hook, accumulate without "
            "sharding, or clip inside the loss."
        )


def _total(sizes: list) -> Any:
    return sum(sizes) if all(isinstance(n, int) for n in sizes) else tf.add_n(sizes)


@library_code
def _prepare(
    optimizer: AppliesGradients, strategy: VariableStrategy, model: Any, num_copies: int
) -> None:
    """Names a towers optimizer's state after the model; builds a lone Keras optimizer.

    A list of variables with repeated names cannot name state; the optimizer then names it
    after the variables, made unique. (`apply_reduced` refuses foreign optimizers for several
    copies.)
    """
    if num_copies == 1 and is_keras(optimizer) and not getattr(optimizer, "built", True):
        optimizer.build(strategy.tower_variables(model, None))  # all slots, as checkpoints do
    if isinstance(optimizer, Optimizer):
        try:
            copies = strategy.state_copies(model)
        except ValueError:
            return
        optimizer.build(copies)
