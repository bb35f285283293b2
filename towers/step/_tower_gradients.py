"""One tower's pass: its loss, outputs and gradients (compiled by XLA on request)."""

from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from towers.core import TowerContext, as_caller_would, current_tower, user_code_entry
from towers.ops.internal import HALF, library_code, narrow_form
from towers.step._compiled import CompiledTower, check_jit_compile
from towers.step._loss_scale import scale_value
from towers.step._micro_batches import check_micro_batches, in_micro_batches
from towers.step._tower_builder import resolve_strategy
from towers.variables import VariableStrategy
from towers.workers import current_workers

Variables = Sequence[tf.Variable] | tf.Module | VariableStrategy


@user_code_entry
def tower_gradients(
    loss_fn: Callable[[Any], Any],
    variables: Variables,
    shard: Any,
    *,
    variable_strategy: VariableStrategy | None = None,
    loss_scale: Any = None,
    micro_batches: int = 1,
    merge: str | Any = "concat",
    jit_compile: bool = False,
) -> tuple[tf.Tensor, Any, list]:
    """Runs `loss_fn` on one shard and returns its loss, outputs and gradients.

    Args:
      loss_fn: Called with the shard; returns the mean loss over the shard (a scalar), or a
        pair `(loss, outputs)`.
      variables: The variables to differentiate, a `tf.Module` whose trainable variables
        are read after `loss_fn` ran (so a model may create them on its first call), or a
        strategy holding its own copies (`Replicated`: the current tower's copy).
      shard: This tower's inputs.
      variable_strategy: The strategy that says which variables this tower reads; default
        the strategy of the tower being built (`replicate`'s), else as in `train_step`.
      loss_scale: None, a number or a `towers.LossScale`: the gradients are those of the
        loss times the scale (the loss returned is not scaled).
      micro_batches: Run the shard as this many parts, one after the other (the memory of
        one part), gradients and loss averaged by part size.
      merge: How to merge the parts' outputs, as `ops.merge_outputs`'s `mode`.
      jit_compile: Compile the forward and backward pass with XLA, one program on the
        tower's device (each micro-batch runs it in turn). With two towers of one worker,
        one pass each, a static batch size and unsharded state, a float32 variable's
        gradient that is a half-precision one cast (mixed precision) leaves the program in
        half precision and is cast outside it, where the exchange can send it narrow. See
        docs/compiled.md.

    Returns:
      `(loss, outputs, grads)`, outputs None when `loss_fn` returned only a loss, grads aligned
      with the tower's variables.

    Raises:
      ValueError: if the loss is not a floating scalar, or there are no variables.
      TypeError: if `jit_compile` is not a bool.
    """
    strategy = resolve_strategy(variables, variable_strategy)
    micro_batches = check_micro_batches(micro_batches)
    loss_fn = as_caller_would(loss_fn)
    jit_compile = check_jit_compile(jit_compile)

    def one_pass(inputs: Any) -> tuple[tf.Tensor, Any, list]:
        with tf.GradientTape() as tape:
            loss, outputs = _loss_and_outputs(loss_fn(inputs))
            scale = 1.0 if loss_scale is None else scale_value(loss_scale)
            scaled = loss if loss_scale is None else loss * tf.cast(scale, loss.dtype)
        trained = strategy.tower_variables(variables, current_tower())
        grads = tape.gradient(scaled, trained)
        return loss, outputs, [_shaped(g, v) for g, v in zip(grads, trained)]

    tower = current_tower()
    if not jit_compile or (tower is not None and tower.compiled):  # (inside its program)
        return _passes(one_pass, shard, micro_batches, merge)
    if tower is None:
        raise ValueError(
            "tower_gradients(jit_compile=True) compiles a tower's pass on the tower's device: "
            "call it inside towers.replicate (or use train_step(..., jit_compile=True))."
        )
    if not _sent_narrow(tower, strategy, micro_batches, shard):
        return _passes(CompiledTower(one_pass, tower), shard, micro_batches, merge)
    compiled = CompiledTower(_narrowed(one_pass), tower)

    def compiled_pass(inputs: Any) -> tuple[tf.Tensor, Any, list]:
        loss, outputs, grads = compiled(inputs)
        trained = strategy.tower_variables(variables, tower)
        return loss, outputs, [_widened(g, v) for g, v in zip(grads, trained)]

    return _passes(compiled_pass, shard, micro_batches, merge)


def _sent_narrow(
    tower: TowerContext, strategy: VariableStrategy, micro_batches: int, shard: Any
) -> bool:
    """Whether the exchange may send this tower's exact half-precision gradients narrow.

    A strategy that says so (`VariableStrategy.sends_narrow`: two towers, no `wire_dtype`,
    state not sharded, and for a parameter server gradients packed in buckets), one worker,
    one pass each (micro-batches add the passes' gradients in float32 first), and a batch
    size known when the step is built (the exchange sends narrow only for equal weights it
    can see). Elsewhere the program returns float32, as it would with no exchange at all: a
    cast outside it would be one more kernel per gradient, for nothing. (Unequal shards of a
    static batch are seen only after the towers are built: those gradients leave the program
    narrow and are cast back outside it. Sharded state with a gradient hook all-reduces
    every gradient and could send them narrow; it gets float32.)
    """
    leaves = tf.nest.flatten(shard)
    sized = bool(leaves) and all(
        getattr(t, "shape", None) is not None and t.shape.rank and t.shape[0] is not None
        for t in leaves
    )
    return (
        strategy.sends_narrow(tower.num_towers)
        and current_workers().num_workers == 1
        and micro_batches == 1
        and sized
    )


def _narrowed(one_pass: Callable) -> Callable:
    """`one_pass`, returning the half-precision tensor of an exactly half-precision gradient.

    Under mixed precision a float32 variable's gradient is a cast of a half-precision one. A
    compiled program's output hides the cast, so the program returns the half-precision
    tensor and the caller casts it outside (`_widened`), where an exchange of two towers
    finds it and sends it narrow (`towers.ops._exact_widening`).
    """

    def narrowed(inputs: Any) -> tuple[tf.Tensor, Any, list]:
        loss, outputs, grads = one_pass(inputs)
        forms = [narrow_form(g) for g in grads]
        return loss, outputs, [g if f is None else f for g, f in zip(grads, forms)]

    return narrowed


def _widened(grad: Any, var: tf.Variable) -> Any:
    """A gradient `_narrowed` returned in half precision, cast back to its variable's float32."""
    if isinstance(grad, tf.Tensor) and grad.dtype in HALF and tf.as_dtype(var.dtype) == tf.float32:
        return tf.cast(grad, tf.float32)
    return grad


def _shaped(grad: Any, var: tf.Variable) -> Any:
    """`grad` with its variable's static shape (a gradient through dynamic shapes loses it)."""
    if isinstance(grad, tf.Tensor) and grad.shape.is_compatible_with(var.shape):
        grad.set_shape(var.shape)
    elif isinstance(grad, tf.IndexedSlices) and var.shape.rank:
        row = tf.TensorShape([None]).concatenate(var.shape[1:])
        if grad.values.shape.is_compatible_with(row):
            grad.values.set_shape(row)
    return grad


def _passes(one_pass: Callable, shard: Any, micro_batches: int, merge: Any) -> tuple:
    if micro_batches == 1:
        return one_pass(shard)
    return in_micro_batches(one_pass, shard, micro_batches, merge)


@library_code
def _loss_and_outputs(result: Any) -> tuple[tf.Tensor, Any]:
    """`loss_fn`'s result as (a floating scalar loss, outputs or None), or a clear error."""
    if isinstance(result, (tuple, list)) and len(result) != 2:
        raise ValueError(
            f"`loss_fn` must return the mean loss over its shard, or a pair (loss, outputs); got "
            f"a {type(result).__name__} of {len(result)}. Group extra outputs: "
            "`return loss, (logits, other)`."
        )
    loss, outputs = result if isinstance(result, (tuple, list)) else (result, None)
    if not isinstance(loss, (tf.Tensor, tf.Variable, float)):
        raise ValueError(
            f"`loss_fn` must return the mean loss over its shard as a floating scalar tensor (or "
            f"a pair (loss, outputs)); got {type(loss).__name__}. Did it forget to return?"
        )
    loss = tf.convert_to_tensor(loss)
    if loss.shape.rank != 0 or not loss.dtype.is_floating:
        raise ValueError(
            f"`loss_fn` must return the mean loss over its shard as a floating scalar (or a "
            f"pair (loss, outputs)); got {loss.dtype.name} of shape {loss.shape}. Reduce it "
            "with tf.reduce_mean."
        )
    return loss, outputs


@library_code
def check_some_gradient(grads: list, variables: list[tf.Variable]) -> None:
    """Refuses a step in which no variable gets a gradient: it would do nothing, silently."""
    if all(g is None for g in grads):
        names = [v.name for v in variables]
        raise ValueError(
            f"No variable gets a gradient from the loss: {names}. The loss must be computed "
            "from the trained variables (not from a copy, a constant or under "
            "tf.stop_gradient); check that `loss_fn` calls the model it is given."
        )
