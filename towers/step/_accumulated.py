"""One call of an accumulating step: judged, held, and every N-th call the mean applied.

With `GradientAccumulator(every=N)` each call is judged as it comes, on the sums it would
make (`GradientAccumulator.with_call`, judged in `reduced_updates`: a NaN or
Inf gradient, or one that would overflow the sums, is a bad call; the learning rate is not
judged yet, nothing is applied), and held (`GradientAccumulator.peek`). On a call that
completes N calls, their mean with the calls before it goes through the gradient hook, is
judged again (the learning rate, the hook's output) and applied under that verdict. The
call's own writes (its gradients into the sums, or the reset after an update; the call and
example counts; state beside the weights, such as BatchNorm's moving averages) come after
that and follow both verdicts. Where the mean is not applied:

- "raise": the call fails and writes nothing; it is not counted, and the next good call
  completes the cycle with the mean of the good ones.
- "skip": the call and its cycle are skipped: the call is counted (and a `LossScale` counts
  a skipped step, as it does for a step without accumulation), the sums and the examples are
  reset.
"""

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from towers.ops.internal import device_scope, host_scope, library_code, update_ops
from towers.step._accumulator import GradientAccumulator
from towers.step._loss_scale import LossScale
from towers.step._nonfinite import kept_state, raised
from towers.step._verdict import Verdict
from towers.variables import ReducedGradients


@library_code
def accumulated_updates(
    reduced: Sequence[ReducedGradients],
    sums: Sequence[list],
    verdict: Verdict,
    accumulate: GradientAccumulator,
    batch_size: Any,
    *,
    apply: Callable[..., tuple[list, Verdict]],
    nonfinite: str | None,
    loss_scale: Any,
    state_updates: Sequence[Callable[[], Any]],
    after: Sequence[Any],
) -> list:
    """The writes of one accumulating call (run them all).

    Args:
      reduced: The strategy's reduced gradients (their copies and variables).
      sums: Per copy, the sums with this call's unscaled gradients (`with_call`).
      verdict: This call's verdict on `sums`.
      accumulate: The accumulator.
      batch_size: This call's number of examples.
      apply: `(means, nonfinite=, others=)` -> the mean's updates and their verdict.
      nonfinite: The resolved mode.
      loss_scale: The loss scale; a `LossScale` hears of every call ("skip").
      state_updates: `DeferredUpdate`s beside the weights.
      after: What the mean's own "raise" check waits for too (a staged input's staging).
    """
    means, pending = [], []
    for i, (copy, copy_sums) in enumerate(zip(reduced, sums)):
        with device_scope(copy.device):
            size = batch_size
            if nonfinite is not None:  # a skipped call adds no examples
                size = tf.where(verdict.of(i), tf.cast(batch_size, tf.float32), 0.0)
            copy_means, held = accumulate.peek(copy_sums, copy.variables, size, verdict.of(i))
        means.append(copy_means)
        pending += held
    if nonfinite is not None:
        batch_size = tf.where(verdict.chosen, tf.cast(batch_size, tf.float32), 0.0)
    # "raise": a failing call changes nothing, the cycle it would complete included (its
    # mean's update writes old values), so the sums stay as before it.
    this_call = verdict.finite if nonfinite == "raise" else None

    judged: list[Verdict] = []  # the mean's verdict, as the cond's branch built it

    def now() -> tuple[tf.Tensor, tf.Tensor]:  # the mean checked again: its calls may be skipped
        others = [this_call] if this_call is not None else False
        mean, verdict_of_mean = apply(means, nonfinite=nonfinite, others=others)
        judged.append(verdict_of_mean)
        with tf.control_dependencies(update_ops(mean)), host_scope():
            return tf.identity(verdict_of_mean.chosen), verdict_of_mean.flat_flags()

    def later() -> tuple[tf.Tensor, tf.Tensor]:
        # A graph's cond traces `now` first (its flags' count); eagerly, only one runs.
        count = sum(flag.shape.num_elements() for flag in judged[0].flags) if judged else 0
        with host_scope():
            return tf.constant(True), tf.ones([count], tf.bool)

    ready = accumulate.ready()  # on the host: the calls' count, not a device's value
    # The cond beside its predicate: unplaced, it (and its branches' constants) went to the
    # first GPU, whichever devices the towers are on.
    with host_scope():
        applied, flags = tf.cond(ready, now, later)
        kept = tf.logical_or(tf.logical_not(ready), applied)  # this call's writes stand
        writes = None if this_call is None else tf.logical_and(this_call, kept)
    updates = kept_state(state_updates, _also(verdict, kept))
    if isinstance(loss_scale, LossScale) and nonfinite != "raise":
        with tf.control_dependencies(update_ops(means)):  # (after their reads of the scale)
            updates.append(loss_scale.update(tf.logical_and(verdict.chosen, kept)))
    # "skip" drops a cycle whose mean is not applied, as a skipped step's gradients are
    # dropped; "raise" keeps it: the call fails, nothing changed.
    finished = accumulate.finish(
        ready,
        batch_size,
        after=[applied],
        keep=writes,
        pending=pending,
        applied=applied if nonfinite == "raise" else True,
    )
    updates = [applied, finished, *updates]
    # "raise": the mean's check after every write of the call, as a step's own is (a write
    # that chooses its old value after writing must not be cut between the two).
    if not judged or not judged[0].flags:
        return updates
    mean_verdict = dataclasses.replace(judged[0], finite=applied, flags=(flags,), copies=())
    return updates + raised(mean_verdict, [*updates, *after], verdict.finite)


def _also(verdict: Verdict, kept: tf.Tensor) -> Verdict:
    """`verdict`, each of its flags also requiring `kept` (none checked: unchanged)."""
    if verdict.finite is None:
        return verdict

    def also(flag: tf.Tensor) -> tf.Tensor:
        with tf.device(flag.device):  # where the writes that read it are
            return tf.logical_and(flag, kept)

    copies = tuple(also(flag) for flag in verdict.copies)
    return dataclasses.replace(verdict, finite=also(verdict.finite), copies=copies)
