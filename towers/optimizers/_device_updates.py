"""One copy's updates on one device: chosen by the non-finite verdict, compiled or not.

`Optimizer.apply_gradients` groups a copy's variables by device and builds each group here:
the rule's in-place updates, each written variable (slots included) then kept or written
back as it was by the verdict (`towers.ops.internal.selected`), and with `jit_compile` all
of it as one XLA program on the device, which reads only that device's variables (the rate
and the step count come in as arguments). Without `jit_compile` a towers rule's update is
one such program on a GPU too (`_programmed`), TensorFlow's kernels elsewhere. Given a
`Judged` instead of a verdict, the program decides the verdict itself, from the gradients it
applies and the rate it uses.
"""

import dataclasses
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from towers.ops.internal import (
    densified,
    device_scope,
    finite_flags,
    flags_where_made,
    in_programs,
    packed_arguments,
    selected,
    update_ops,
)


@dataclasses.dataclass
class Judged:
    """A verdict a copy's compiled update decides inside its program (on one device).

    The program checks every gradient it applies (as it applies it: dense) and the learning
    rate (when not a number), then chooses its writes by the result: no second program and
    no tensor between the check and the update. Filled in when the update is built.

    Attributes:
      finite: The verdict, a boolean scalar on the copy's device.
      flags: Each gradient's flag, in order, then the rate's (when checked).
      rate_checked: Whether the last flag is the learning rate's.
      before: Computes `flags` again in the caller's scope from what the program reads
        (each gradient's flags that crossed with its bucket's terms, and the rate), for a
        check that need not wait for the program (the host's, for "raise"): the same
        booleans by the same computation. It returns None, building nothing, where some
        gradient is checked inside the program.
    """

    finite: tf.Tensor | None = None
    flags: tf.Tensor | None = None
    rate_checked: bool = False
    before: Callable[[], tf.Tensor | None] | None = None


def copy_updates(
    optimizer: Any, copy: int, group: list, finite: tf.Tensor | None, jit_compile: bool
) -> list:
    """One copy's updates, device by device, and its step count (advanced where finite).

    Args:
      optimizer: The towers `Optimizer`.
      copy: Which copy of the variables.
      group: `(grad, var, state)` of each of its variables to update.
      finite: The verdict, None, or a `Judged` (with `jit_compile`, the copy on one device):
        the program decides it, and the `Judged` holds it afterwards.
      jit_compile: One XLA program per device (without it: per GPU, for a towers rule's
        dense updates, `_programmed`; TensorFlow's kernels elsewhere).
    """
    counter = optimizer.iterations.get(copy)
    with device_scope(counter.device if counter is not None else None):
        with tf.name_scope(optimizer.name):
            done = counter.read_value() if counter is not None else tf.constant(0, tf.int64)
            lr = None
            if not isinstance(optimizer.learning_rate, (int, float)):
                lr = tf.cast(optimizer.current_learning_rate(done), tf.float32)
    updates, judged = [], finite if isinstance(finite, Judged) else None
    devices = by_device(group)
    if judged is not None and (not jit_compile or len(devices) != 1):
        raise ValueError("A verdict judged in the update needs one compiled program.")
    for device, items in devices.items():
        with tf.device(device), tf.name_scope(optimizer.name):
            if judged is not None:
                judged.rate_checked = lr is not None
                program = _program(optimizer, items, judged=True)
                ran, judged.finite, judged.flags = program(lr, done, None)
                judged.before = _flags_before([grad for grad, _, _ in items], lr)
                updates.append(ran)
                finite = judged.finite
                continue
            programmed, kernels = items, []
            if not jit_compile:
                programmed, kernels = _programmed(optimizer, items, device, finite is not None)
            if programmed:
                updates.append(_program(optimizer, programmed)(lr, done, finite))
            if kernels:
                grads = [grad for grad, _, _ in kernels]
                updates += device_update(optimizer, kernels, grads, lr, done, finite)
    if counter is None:
        return updates
    with tf.device(counter.device), tf.control_dependencies(update_ops(updates)):
        one = tf.constant(1, tf.int64) if finite is None else tf.cast(finite, tf.int64)
        return [*updates, counter.assign_add(one)]


def _flags_before(grads: list, lr: tf.Tensor | None) -> Callable[[], tf.Tensor | None]:
    """A `Judged`'s `before`: its program's flags from the flags the devices made.

    The program stacks each gradient's flag, then the rate's `is_finite` (`compiled_update`);
    this builds the same from each gradient's flags combined where they were made
    (`flags_where_made`), in the caller's scope, or returns None (building nothing).
    """

    def built() -> tf.Tensor | None:
        flags = flags_where_made(grads)
        if flags is None or lr is None:
            return flags
        return tf.concat([flags, tf.reshape(tf.math.is_finite(lr), [1])], 0)

    return built


def by_device(group: list) -> dict[str, list]:
    """`(grad, var, state)` items by their variable's device, in order."""
    found: dict[str, list] = {}
    for item in group:
        found.setdefault(item[1].device, []).append(item)
    return found


def _programmed(optimizer: Any, items: list, device: str, guarded: bool) -> tuple[list, list]:
    """The items an uncompiled step still updates in one XLA program on `device`, and the rest.

    On devices where each kernel is a launch of its own (GPUs: `towers.ops.internal.in_programs`)
    a towers rule's update is one program per device even when the towers are not compiled:
    its code is ours and compiles, and inside the program the guard's choice fuses into the
    update's own pass over each variable (outside, the old values are copied before the
    in-place writes and chosen after them: two more passes over every variable). Stay
    TensorFlow's kernels: a subclass's own rule (it may hold ops XLA cannot compile), non-float
    variables, an eager call (it would trace and compile the program again at every call),
    rows of a sparse gradient whose number changes from step to step (XLA would compile again
    for each number) and, without a verdict (`guarded` False), any sparse rows: made dense in
    the program they would cost a pass over the whole table, where the kernels touch only the
    rows (with a verdict the whole table is copied and chosen anyway).
    """
    if tf.executing_eagerly() or not in_programs(device) or not _own_rule(optimizer):
        return [], items
    programmed, kernels = [], []
    for item in items:
        grad, var, _ = item
        sparse = isinstance(grad, tf.IndexedSlices)
        varying = sparse and not grad.values.shape.is_fully_defined()
        ok = var.dtype.is_floating and not varying and (guarded or not sparse)
        (programmed if ok else kernels).append(item)
    return programmed, kernels


def one_program(optimizer: Any, pairs: list, device: str | None) -> bool:
    """Whether an uncompiled update of `(grad, var)` `pairs` on `device` is one XLA program.

    As `_programmed` under a verdict: a GPU, a towers rule, and every pair in the program
    (float variables, no sparse rows whose number changes). Then the program can also decide
    the verdict.
    """
    items = [(grad, var, None) for grad, var in pairs]
    if not items or not device:
        return False
    programmed, _ = _programmed(optimizer, items, device, guarded=True)
    return len(programmed) == len(items)


def _own_rule(optimizer: Any) -> bool:
    """Whether the optimizer's rule is towers' own code (a subclass may write any ops)."""
    kind, names = type(optimizer), ("update", "update_sparse", "_update_one")
    return not any(name in vars(optimizer) for name in names) and all(
        getattr(kind, name).__module__.startswith("towers.optimizers.") for name in names
    )


def _program(optimizer: Any, items: list, judged: bool = False) -> Callable[..., Any]:
    """`compiled_update` of `items`, given their gradients: call it with `(lr, done, finite)`."""
    grads = [_static(grad, var) for grad, var, _ in items]
    given, terms, rebuilt = packed_arguments(grads, checked=judged)
    program = compiled_update(optimizer, items, rebuilt, judged=judged)
    return lambda lr, done, finite: program(given, terms, lr, done, finite)


def _static(grad: Any, var: tf.Variable) -> Any:
    """`grad` as an XLA program's argument: its shape the same at every step.

    Rows of `tf.IndexedSlices` whose number changes from step to step (each row once, after
    the duplicates are summed: as many as the batch's distinct ids) would make XLA compile
    the program again for each new number; they are made dense here, on the device (the
    program would make them dense anyway).
    """
    if isinstance(grad, tf.IndexedSlices) and not grad.values.shape.is_fully_defined():
        return densified(grad, var)
    return grad


def compiled_update(
    optimizer: Any, items: list, rebuilt: Callable[[list, list], list], judged: bool = False
) -> Callable[..., Any]:
    """`device_update` of `items` as one XLA program (traced when first called).

    The program takes the gradients as `packed_arguments` gives them (all-reduced ones as
    their buckets' terms) and builds them with `rebuilt`: the sums, the mean's weight and
    the unpacking fuse into the update's reads. With `judged`, the program decides the
    verdict first (every gradient as it is applied, dense, and the rate when given) and
    returns `(done, finite, flags)`: all-reduced gradients are checked in their summed
    buckets (`packed_arguments`), where they lie, the others one by one.
    """

    def update(given: list, terms: list, lr: Any, done: tf.Tensor, finite: Any) -> Any:
        if not judged:
            grads = rebuilt(given, terms)
        else:
            grads, known = rebuilt(given, terms, checked=True)  # sums read in their buckets
            dense = [
                densified(g, var) if isinstance(g, tf.IndexedSlices) else g
                for g, (_, var, _) in zip(grads, items)
            ]
            rest = [i for i in range(len(dense)) if i not in known]  # checked one by one
            if rest:
                known.update(zip(rest, tf.unstack(finite_flags([dense[i] for i in rest]))))
            flags = [known[i] for i in range(len(dense))]
            flags = tf.stack(flags) if flags else tf.zeros([0], tf.bool)
            if lr is not None:
                flags = tf.concat([flags, tf.reshape(tf.math.is_finite(lr), [1])], 0)
            finite, grads = tf.reduce_all(flags), dense
        built = device_update(optimizer, items, grads, lr, done, finite, compiled=True)
        with tf.control_dependencies(built):  # the program's output; its writes are its effect
            if judged:
                return tf.constant(True), tf.identity(finite), tf.identity(flags)
            return tf.constant(True)

    return tf.function(update, jit_compile=True, autograph=False)


def device_update(
    optimizer: Any,
    items: list,
    grads: list,
    lr: tf.Tensor | None,
    done: tf.Tensor,
    finite: tf.Tensor | None,
    compiled: bool = False,
) -> list:
    """The updates of `items` (one device's), kept only where `finite`: a list of ops.

    Args:
      optimizer: The towers `Optimizer`.
      items: `(grad, var, state)` of each variable (the gradient as given).
      grads: The gradients to apply, aligned with `items`.
      lr: The learning rate (float32), or None for the optimizer's number.
      done: The copy's step count before this update.
      finite: The verdict, or None to keep every write.
      compiled: Inside an XLA program: sparse gradients are made dense (XLA has no unique).
    """
    # A plain number becomes each variable's dtype directly: through float32, a float64
    # model's rate would be off by up to 3e-8 relative.
    number = lr is None and optimizer.learning_rate
    cast: dict = {}

    def build() -> list:
        updates = []
        for grad, (_, var, state) in zip(grads, items):
            if var.dtype not in cast:
                rate = tf.constant(number, var.dtype) if lr is None else lr
                cast[var.dtype] = (tf.cast(rate, var.dtype), tf.cast(done + 1, var.dtype))
            if compiled and isinstance(grad, tf.IndexedSlices):
                grad = densified(grad, var)
            updates.append(optimizer._update_one(grad, var, state.slots, *cast[var.dtype]))
        return updates

    written = [v for _, var, state in items for v in (var, *state.slots.values())]
    return selected(finite, written, build, programs=not compiled)
