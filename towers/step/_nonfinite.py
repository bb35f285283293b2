"""The non-finite guard: the step's verdict, decided and applied on the devices.

A step whose gradients (or learning rate) hold a NaN or Inf changes no state: every update
of it writes, and each written variable then takes its old value back where the verdict is
False (`towers.ops.internal.selected`: a `tf.where` on the device). No update waits for the
host: a `tf.cond` or an `Assert` in front of the updates would copy the verdict to the host
and stall every update behind it (4-18% of a GPU step, measured); and `Replicated` copies
that hold the same all-reduced gradients each judge their own, so that no verdict crosses
between devices either (on the H200 the guard cost 8% of a GPT step at K=2 with one verdict,
2% with each copy's own), except the flags each device makes of the buckets it sends
(`towers.ops._crossed_flags`, with `gather_add`), which travel with them. This module owns
the guard: its modes and their one default, the verdict (`towers.step._verdict`; or, for
`Replicated` copies whose updates are compiled, each copy's update program decides it, from
what it applies: `judging_updates`), the choice of every write, and "raise"'s error.

- "skip": the step changes nothing (weights, optimizer slots and step counts, state updated
  beside them such as BatchNorm's moving averages, accumulated sums); a `LossScale` counts it.
- "raise": the same (a `LossScale` counts nothing), then the call fails with an error
  naming the variables whose gradients were not finite (checkpoint names, the first first),
  an `Assert` on the host that surfaces in the same call (a `tf.function`'s call, a v1
  `Session.run` of the loss or the updates). It waits for every transfer and merge of the
  step, and for every update, except where each write is a compiled program that makes the
  verdict's choice itself (`writes_choose`) and the step has `Replicated` copies (for a
  parameter server's updates a CPU probe gave 2-3 errors in most failing calls): there a
  step stopped between its programs has written old values or nothing, so the check waits
  for the exchange only and runs beside the updates; the loss still returns from its host
  copy after the check and the updates.
  (On a GPU a dependency on an update is a transfer queued behind it: session 26's trace
  had the check 0.13 ms after the last update kernel; see docs/precision.md.) Beside the
  updates, a failing check may cut a transfer still under way: TensorFlow then reports
  its error up to once more per device. It reads the verdict's flags, made before the
  updates where it can (checks beside the exchange: `_crossed_flags`' and local verdicts'
  programs), else by an update program.
- None: no check.
"""

import functools
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from towers.ops.internal import device_scope, holds, host_scope, library_code, selected, update_ops
from towers.optimizers import AppliesGradients, Judged, Optimizer
from towers.optimizers._device_updates import one_program
from towers.step._loss_scale import DynamicLossScale
from towers.step._verdict import Verdict, judgeable, judged

NONFINITE = ("raise", "skip", None)
DEFAULT = "default"


def resolve(nonfinite: str | None, loss_scale: Any) -> str | None:
    """The mode a step uses: "default" is "raise", or "skip" with a loss scale.

    Raises:
      ValueError: for an unknown mode, or a `DynamicLossScale` whose steps are not skipped.
    """
    if nonfinite == DEFAULT:
        return "raise" if loss_scale is None else "skip"
    if nonfinite not in NONFINITE:
        raise ValueError(f"`nonfinite` must be one of {NONFINITE} or 'default'; got {nonfinite!r}.")
    if isinstance(loss_scale, DynamicLossScale) and nonfinite != "skip":
        raise ValueError(
            "A DynamicLossScale overflows now and then by design: its steps must be skipped, "
            f"not {nonfinite!r}. Leave `nonfinite` at its default."
        )
    return nonfinite


@library_code
def finite_rate(optimizer: Optimizer, copy: int = 0) -> tf.Tensor | None:
    """Whether a towers optimizer's next rate is finite, as copy `copy`'s update computes it.

    A number was checked when it was given (None: nothing to check); a variable or a
    schedule is checked here (in float32), on the device of the copy's step count.
    """
    if isinstance(optimizer.learning_rate, (int, float)):
        return None
    counter = optimizer.iterations.get(copy, next(iter(optimizer.iterations.values()), None))
    with device_scope(counter.device if counter is not None else None):
        done = counter.read_value() if counter is not None else tf.constant(0, tf.int64)
        rate = tf.cast(optimizer.current_learning_rate(done), tf.float32)
        return tf.reduce_all(tf.math.is_finite(rate))


def applied(
    optimizer: AppliesGradients,
    apply_gradients: Callable[[list], Any],
    pairs: list,
    finite: tf.Tensor | None,
    jit_compile: bool,
) -> Any:
    """One copy's update under its verdict `finite` (None: no check).

    A towers optimizer chooses its writes on the device (and compiles them with
    `jit_compile`). Any other optimizer's writes are unknown to towers: its update runs
    under `tf.cond` on the verdict, which reads the verdict on the host.
    """
    if isinstance(optimizer, Optimizer):
        return optimizer.apply_gradients(pairs, finite=finite, jit_compile=jit_compile)
    if finite is None:
        return apply_gradients(pairs)
    return tf.cond(finite, lambda: _done(apply_gradients(pairs)), _skipped)


def judged_inside(reduced, grads, nonfinite, others, jit: bool, optimizer, alike) -> bool:
    """Whether each copy's update program decides its verdict.

    A towers optimizer, copies that judge alone (`judgeable`), and their updates compiled:
    with `jit`, or each copy's whole update one program on its GPU (`one_program`). Not one
    copy under "raise": no flags cross with buckets before its program (`Judged.before`),
    so the host's check would read the program's and wait for its end before it could
    compute its report; the flags are made in front of the update instead, and the check
    runs beside it (on an H100, 0.3% of an uncompiled GPT step: wave 5, session 35; in a step
    compiled whole, `towers.step._one_program`, both lie in its one program).
    """
    if nonfinite is None or not alike or not isinstance(optimizer, Optimizer):
        return False
    if nonfinite == "raise" and len(reduced) == 1:
        return False
    if not jit and not all(
        one_program(
            optimizer, [(g, v) for g, v in zip(copy_grads, c.variables) if g is not None], c.device
        )
        for c, copy_grads in zip(reduced, grads)
    ):
        return False
    elsewhere = flags_elsewhere(reduced, others)
    variables = [c.variables for c in reduced]
    return judgeable(grads, variables, [c.device for c in reduced], elsewhere)


def flags_elsewhere(reduced, others) -> list:
    """Flags from elsewhere: other processes' shares (`others` True), none (False), or listed."""
    if others is True:
        return [c.finite for c in reduced if c.finite is not None]
    return list(others or [])


def judging_updates(
    reduced, grads, optimizer: Optimizer, nonfinite: str, pairs: Sequence[list]
) -> tuple[list, Verdict]:
    """Each copy's one update program, its verdict decided inside (no program before it).

    `pairs[i]`: the (gradient, variable) pairs copy i updates.
    """
    copies, updates = [], []
    for copy, updated in zip(reduced, pairs):
        copies.append(Judged())
        with device_scope(copy.device):
            updates.append(optimizer.apply_gradients(updated, finite=copies[-1], jit_compile=True))
    names_of = functools.partial(optimizer.state_name, create=False)
    variables = [c.variables for c in reduced]
    devices = [c.device for c in reduced]
    return updates, judged(copies, grads, variables, devices, nonfinite, names_of)


def writes_choose(optimizer, jit: bool, state, accumulate, scale, reduced=(), hook=None) -> bool:
    """Whether every write of the step is a program that makes the verdict's choice inside.

    A step stopped between such programs has written old values or nothing. That is a towers
    optimizer's compiled programs (with `jit`; or, without, on a GPU: one copy in `reduced`, on
    a device of its own (not a parameter server's) that holds every one of its variables, whose
    update is one program there, `one_program`, and no `hook` to change what it applies), no
    deferred state updates (`state`), no accumulation and no loss scale (whose state changes
    after the updates). (Uncompiled copies on several GPUs keep their check after the updates:
    not measured to gain, and a failing check beside them may cut each device's transfers; one
    copy's may cut its result's copy to the host, as compiled copies' may: one error more.)
    """
    if not isinstance(optimizer, Optimizer):  # (`one_program` reads a towers rule's methods)
        return False
    if not jit and hook is None and len(reduced) == 1 and reduced[0].device:
        (copy,) = reduced  # (a copy of its own device: not a parameter server's)
        pairs = [(g, v) for g, v in zip(copy.grads, copy.variables) if g is not None]
        on_it = all(holds(copy.device, v.device) for _, v in pairs)  # (one device's transfers)
        jit = on_it and one_program(optimizer, pairs, copy.device)
    return jit and not state and accumulate is None and scale is None


def kept_state(updates: Sequence[Any], verdict: Verdict) -> list:
    """Builds the deferred state updates (`DeferredUpdate`s) under the verdict.

    An update that names what it writes is chosen on the device (by the verdict of its
    device's copy); one that does not (None) runs under `tf.cond`.
    """
    built = []
    for update in updates:
        finite = verdict.at(update.device)
        if finite is None:
            built += update_ops(update())
        elif update.writes is not None:
            built += selected(finite, update.writes, update, programs=True)
        else:
            built.append(tf.cond(finite, lambda u=update: _done(u()), _skipped))
    return built


def _done(updates: Any) -> tf.Tensor:
    with tf.control_dependencies(update_ops(updates)):
        return tf.constant(True)


def _skipped() -> tf.Tensor:
    return tf.constant(False)


@library_code
def checked_loss(
    verdict: Verdict,
    updates: Sequence[Any],
    loss: tf.Tensor,
    outputs: Any,
    exchanged: Any = None,
    staging: Sequence[Any] = (),
) -> Any:
    """The step's loss, returned after its updates and, for "raise", after the host check.

    With a check, the loss is copied to the host first and returned from there; the check
    waits for the copy, the updates, the merged outputs and the `staging` of staged input's
    next batch (`StagedInput.take`: cut, it left a batch staged twice or the iterator
    cancelled; wave 5, session 35). Once it can fail nothing of the
    step still crosses between devices, so TensorFlow reports its error once, not once more
    for each transfer it cut short. (Tried in wave 5, 6aae2ee, reverted: the check beside
    its verdict on the GPU and the loss returned from there, to spare a tf.function's result
    its copy back to the GPU. Every result of a tf.function waits for every check, so each
    result on another device (outputs merged on the host, a nested function's, an
    accumulating step's) became a transfer the failing check cut: "2 root error(s)".)

    Except where `exchanged` (the step's exchanged gradients) is given, which the step does
    where every write chooses for itself (`writes_choose`): there the check waits for the
    exchange, not the updates, and runs beside them. The loss still returns from its host
    copy once the check and the updates have run (on a GPU, until they have run), so that a
    v1 `Session.run` of the loss runs the updates. (Until wave 5, session 38 it returned from
    the device where it was merged: after the update a transfer to the GPU carried the
    check's control edge, and the loss then crossed back to the host, two serial transfers
    at the step's end; session 35's trace measured 0.23 ms after the last update kernel.) A
    failing check may cut a transfer of the updates' control edges to the host: its error
    may come up to once more per device.
    """
    if verdict.mode != "raise" or not verdict.flags:
        with tf.control_dependencies(update_ops(updates)):
            return tf.identity(loss)
    early = exchanged is not None
    with host_scope():
        copied = tf.identity(loss)
        check = raised(verdict, [exchanged if early else updates, copied, outputs, *staging])
        with tf.control_dependencies(update_ops(updates) + check):
            return tf.identity(copied)


@library_code
def raised(verdict: Verdict, after: Sequence[Any], call: tf.Tensor | None = None) -> list:
    """For "raise": the host check that fails the call, built after the updates `after`.

    The updates never wait for it (they write their old values back on their own); it waits
    for them (on a GPU, until they have run: see the module), so that a failing step has
    nothing of its own left to run on the host (no transfer to cut) and nothing new to write
    when it fails. Its condition is the conjunction of the verdict's flags (every verdict is
    theirs), read where they are made: no other value has to reach the host. Only the
    `Assert` waits for `after`: what it reports (the condition, the names of the bad
    gradients) is computed from the flags alone, while the updates run, so that the step's
    end is the wait and the `Assert`, not the wait and every op of the check in turn.

    Args:
      verdict: What the check reads.
      after: What it waits for (update ops, tensors, nested).
      call: Optional: the verdict of the call this check is part of, whose own check comes
        after it. Where that is False this one stays silent, so that the call fails with
        one error (an accumulated mean whose every call was skipped is not finite either;
        two failing checks in one call are errors TensorFlow reports two or three times).

    Returns:
      The check's op (in a list), or [] for another mode.
    """
    if verdict.mode != "raise" or not verdict.flags:
        return []
    with host_scope():
        flags = verdict.flat_flags()
        finite = tf.reduce_all(flags)  # (every verdict is its flags' conjunction)
        if call is not None:
            finite = tf.logical_or(finite, tf.logical_not(call))
        flags = tf.gather(flags, list(verdict.ranked))
        names = tf.constant([verdict.names[i] for i in verdict.ranked])
        bad, _ = tf.unique(tf.gather(names, tf.where(tf.logical_not(flags))[:, 0]))
        message = [  # made here, not under the wait (Assert would make its constants there)
            # No quote marks: Assert prints its strings C-escaped (an apostrophe as \').
            tf.constant(
                "towers: a NaN or Inf in the gradients of this step (or in the learning rate), for"
            ),
            bad,
            tf.constant(
                "(checkpoint names, the first first). The step changed nothing: weights, "
                "optimizer state, moving averages and accumulated sums are as before it. To "
                "skip such steps instead, pass nonfinite as skip (or a loss scale)."
            ),
        ]
        with tf.control_dependencies(update_ops(after)):
            return [tf.debugging.Assert(finite, message, summarize=20)]
