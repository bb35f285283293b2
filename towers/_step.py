"""A whole data-parallel training step, as a thin composition of the library's stages."""

import functools
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import ops
from ops._tensorflow import tf
from towers._devices import canonical_device
from towers._parameter_server import ParameterServer
from towers._replicate import replicate
from towers._replicated import Replicated

Variables = Sequence[tf.Variable] | tf.Module | Replicated
GradientHook = Callable[[list, list], Sequence]


class Optimizer(Protocol):
    """Anything with `apply_gradients(grads_and_vars)`, like `towers.SGD`."""

    def apply_gradients(self, grads_and_vars: list) -> Any:  # noqa: D102
        ...


def tower_gradients(
    loss_fn: Callable[[Any], Any], variables: Variables, shard: Any
) -> tuple[tf.Tensor, Any, list]:
    """Runs `loss_fn` on one shard and returns its loss, outputs and gradients.

    Args:
      loss_fn: Called with the shard; returns the mean loss over the shard (a scalar), or a
        pair `(loss, outputs)`.
      variables: The variables to differentiate, or a `tf.Module` whose trainable variables
        are read after `loss_fn` ran (so a model may create them on its first call).
      shard: This tower's inputs.

    Returns:
      `(loss, outputs, grads)`, outputs None when `loss_fn` returned only a loss, grads aligned
      with the variables.

    Raises:
      ValueError: if the loss is not a floating scalar, or there are no variables.
    """
    with tf.GradientTape() as tape:
        result = loss_fn(shard)
    loss, outputs = result if isinstance(result, (tuple, list)) else (result, None)
    loss = tf.convert_to_tensor(loss)
    if loss.shape.rank != 0 or not loss.dtype.is_floating:
        raise ValueError(
            f"`loss_fn` must return the mean loss over its shard as a floating scalar (or a "
            f"pair (loss, outputs)); got {loss.dtype.name} of shape {loss.shape}. Reduce it "
            "with tf.reduce_mean."
        )
    return loss, outputs, tape.gradient(loss, variable_list(variables))


@tf.autograph.experimental.do_not_convert
def variable_list(variables: Variables) -> list[tf.Variable]:
    """The list of variables named by `variables`.

    Args:
      variables: A sequence of `tf.Variable`, a `tf.Module` (its trainable variables), or a
        `Replicated` (the current tower's replica's).

    Returns:
      The variables, as a list.

    Raises:
      ValueError: if there are none, or something else than a variable is among them.
    """
    if isinstance(variables, Replicated):
        variables = variables.local()
    found = list(variables.trainable_variables if isinstance(variables, tf.Module) else variables)
    if not found or not all(isinstance(v, tf.Variable) for v in found):
        raise ValueError(
            f"`variables` must be a non-empty list of tf.Variable or a tf.Module with trainable "
            f"variables; got {found!r}."
        )
    return found


def train_step(
    loss_fn: Callable[[Any], Any],
    variables: Variables,
    optimizer: Optimizer,
    inputs: Any,
    devices: Sequence[str],
    *,
    gradient_hook: GradientHook | None = None,
    merge: str | Any = "concat",
    variable_strategy: ParameterServer | None = None,
    split_device: str | None = "/cpu:0",
    merge_device: str | None = "/cpu:0",
) -> tuple[tf.Tensor, Any]:
    """Splits `inputs`, builds one tower per device, averages gradients and applies them.

    The result equals one device's step on the whole batch: tower gradients are weighted by
    shard size, so uneven batches are exact. The body is ten lines of public calls; copy them
    into your loop to change any stage.

    Args:
      loss_fn: Called once per tower with its shard; returns the mean loss over the shard, or
        `(loss, outputs)`.
      variables: The variables to train, a `tf.Module` whose trainable variables are used,
        or a `towers.Replicated` model (one copy per device, gradients all-reduced).
      optimizer: Anything with `apply_gradients`, e.g. `towers.SGD(0.1)`.
      inputs: The whole batch, a nested structure of tensors.
      devices: One device per tower.
      gradient_hook: Called as `hook(grads, variables)` with the averaged gradients; returns
        the gradients to apply (clip, mask, log). None gradients may stay None.
      merge: How to merge the outputs, as `ops.merge_outputs`'s `mode`.
      variable_strategy: Where variables created in towers live; default the CPU. Ignored
        for `Replicated` variables, which are their own strategy.
      split_device: Where the batch is split.
      merge_device: Where the losses and outputs are merged.

    Returns:
      `(loss, outputs)`: the mean loss over the whole batch (evaluating it in a v1 Session
      runs the update too) and the merged outputs (None if `loss_fn` returns only a loss).

    Raises:
      ValueError: for bad inputs (see `ops.split_batch`, `towers.replicate`), a loss that is
        not a scalar, or a hook returning the wrong number of gradients.
    """
    shards = ops.split_batch(inputs, len(devices), device=split_device)
    sizes = ops.shard_sizes(inputs, len(devices))
    tower_fn = functools.partial(tower_gradients, loss_fn, variables)
    if isinstance(variables, Replicated):
        variable_strategy = _matching(variables, devices)
    per_tower = replicate(tower_fn, shards, devices, variable_strategy=variable_strategy)
    losses, outputs, tower_grads = (list(column) for column in zip(*per_tower))
    if isinstance(variables, Replicated):
        update = apply_replicated(variables, tower_grads, sizes, optimizer, gradient_hook)
    else:
        var_list = variable_list(variables)
        grads = ops.average_gradients(tower_grads, weights=sizes, variables=var_list)
        update = _apply(optimizer, grads, var_list, gradient_hook)
    loss = ops.merge_outputs(losses, "mean", weights=sizes, device=merge_device)
    if outputs[0] is not None:
        outputs = ops.merge_outputs(outputs, merge, weights=sizes, device=merge_device)
    else:
        outputs = None
    with tf.control_dependencies(_ops_of(update)):
        loss = tf.identity(loss)
    return loss, outputs


def apply_replicated(
    replicas: Replicated,
    tower_grads: list,
    sizes: list,
    optimizer: Optimizer,
    gradient_hook: GradientHook | None = None,
) -> list:
    """All-reduces tower gradients and applies the same update to every replica.

    Args:
      replicas: The `Replicated` model.
      tower_grads: `K x N` gradients, tower i's for replica i's variables.
      sizes: The shard sizes (weights of the mean).
      optimizer: Applies each replica's update on its device; state per copy.
      gradient_hook: As in `train_step`, called once per replica with its (identical)
        reduced gradients; it must treat them alike to keep the replicas identical.

    Returns:
      The K optimizer updates.
    """
    reduced = replicas.all_reduce(tower_grads, weights=sizes)
    updates = []
    for i, (grads, device) in enumerate(zip(reduced, replicas.devices)):
        with tf.device(device):
            updates.append(_apply(optimizer, grads, replicas.variables_of(i), gradient_hook))
    return updates


def _apply(
    optimizer: Optimizer, grads: list, var_list: list, gradient_hook: GradientHook | None
) -> Any:
    """The hook (if any) on the reduced gradients, then the optimizer on what it returns."""
    if gradient_hook is not None:
        grads = _checked(gradient_hook(grads, var_list), len(var_list))
    return optimizer.apply_gradients([(g, v) for g, v in zip(grads, var_list) if g is not None])


@tf.autograph.experimental.do_not_convert
def _matching(replicas: Replicated, devices: Sequence[str]) -> Replicated:
    if [canonical_device(d) for d in devices] != replicas.devices:
        raise ValueError(
            f"`devices` must be the devices of the Replicated variables; got {list(devices)}, "
            f"replicas on {replicas.devices}."
        )
    return replicas


@tf.autograph.experimental.do_not_convert
def _checked(grads: Sequence, num_vars: int) -> list:
    if not isinstance(grads, (list, tuple)) or len(grads) != num_vars:
        raise ValueError(
            f"`gradient_hook` must return a list of {num_vars} gradients, one per variable; "
            f"got {grads!r}."
        )
    return list(grads)


@tf.autograph.experimental.do_not_convert
def _ops_of(update: Any) -> list:
    """The ops and tensors in an optimizer's return value, for a control dependency."""
    return [u for u in tf.nest.flatten(update) if isinstance(u, (tf.Operation, tf.Tensor))]
