"""Gradient accumulation across calls: one update every N calls of the training step."""

from typing import Any

import tensorflow as tf

from towers.ops.internal import check_int, densified, library_code
from towers.variables import CopiedState, Copies, state_variable


class GradientAccumulator(tf.Module, CopiedState):
    """Sums the gradients of `every` calls of `train_step`, then applies their exact mean.

    Like Horovod's `backward_passes_per_step`: each call adds its reduced (unscaled) gradients
    times its batch size to per-variable sums (one per copy, on the variable's device); every
    `every`-th call the hook and the optimizer get the sums divided by the number of examples
    since the last update, which is the gradient of the mean loss over all those batches,
    also when they differ in size. The sums, the call count and the example count are state:
    keep them with `CheckpointManager(..., extra={"accumulator": accumulator})`.
    `tf.IndexedSlices` are accumulated dense. Every call that uses it must give gradients to
    the same variables (checked while each is traced).

    Args:
      every: Calls per update, >= 1.
      name: The module's name.

    Raises:
      TypeError: if `every` is not an int.
      ValueError: if `every` < 1.

    Example:
      >>> accumulator = towers.GradientAccumulator(every=4)
      >>> towers.train_step(loss_fn, model, optimizer, batch, devices, accumulate=accumulator)
    """

    _TF_MODULE_IGNORED_PROPERTIES = tf.Module._TF_MODULE_IGNORED_PROPERTIES | {"_sums", "_graded"}

    def __init__(self, every: int, name: str = "gradient_accumulator"):
        super().__init__(name=name)
        self.every = check_int(every, "every", minimum=1)
        self._hidden = not tf.inside_function()  # (made in a trace: see `state_variable`)
        zero = lambda: tf.constant(0, tf.int64)  # noqa: E731
        self.calls = state_variable(
            zero, "/cpu:0", hidden=self._hidden, trainable=False, name="calls"
        )
        self.examples = state_variable(
            0.0, "/cpu:0", hidden=self._hidden, trainable=False, name="examples"
        )
        self._sums: dict[Any, tuple[str, int, tf.Variable]] = {}  # var.ref() -> its sum
        self._graded: dict[Any, bool] = {}  # var.ref() -> whether the calls give it gradients
        self.sum_variables: list[tf.Variable] = []

    @library_code
    def build(self, copies: Copies) -> None:
        """Creates the sums of every copy of every variable that lacks one.

        Args:
          copies: Canonical name -> the variable's copies, as strategies give them
            (`state_copies`: None for a copy that keeps no state).
        """
        for name, group in copies.items():
            for copy, var in enumerate(group):
                if var is not None and var.ref() not in self._sums:  # (None: sharded state)
                    total = state_variable(
                        lambda v=var: tf.zeros(v.shape, v.dtype),
                        var.device,
                        hidden=self._hidden,
                        trainable=False,
                        name=f"{name}/sum",
                    )
                    self._sums[var.ref()] = (name, copy, total)
                    self.sum_variables.append(total)

    def variable_copies(self) -> Copies:
        """The sums by "sums/<variable>" (one per copy), and the call and example counts.

        Returns:
          Name -> the state of each copy, the first copy's first.
        """
        found: dict[str, dict[int, tf.Variable]] = {}
        for name, copy, total in self._sums.values():
            found.setdefault(f"sums/{name}", {})[copy] = total
        copies = {name: tuple(v for _, v in sorted(c.items())) for name, c in found.items()}
        return {**copies, "calls": (self.calls,), "examples": (self.examples,)}

    @library_code
    def ready(self) -> tf.Tensor:
        """Whether this call completes `every` calls (read before `finish`).

        Returns:
          A boolean scalar.
        """
        with tf.device(self.calls.device):
            return tf.equal((self.calls + 1) % self.every, 0)

    @library_code
    def add(self, grads: list, variables: list, batch_size: Any, keep: Any = None) -> list:
        """Adds one copy's gradients times the batch size; returns the mean since the update.

        Args:
          grads: The reduced gradients of this call (None: nothing added).
          variables: The variables they belong to (one copy).
          batch_size: This call's number of examples (0 for a call that adds nothing).
          keep: Optional boolean scalar: False adds zeros instead of the gradients (a
            skipped call, whose NaN times a batch size of 0 would still be NaN).

        Returns:
          Per variable, the sum so far divided by the examples so far (None stays None).
        """
        examples = tf.cast(self.examples, tf.float32) + tf.cast(batch_size, tf.float32)
        means = []
        for var, total, held in self._held(grads, variables, batch_size, keep):
            if total is None:
                means.append(None)
                continue
            with tf.device(var.device):
                added = tf.convert_to_tensor(total.assign_add(held))
                means.append(added / tf.cast(examples, held.dtype))
        return means

    @library_code
    def with_call(self, grads: list, variables: list, batch_size: Any) -> list:
        """The sums as they would be with this call's gradients (what the guard judges).

        Finite where the gradients are and their sum with the calls before has not
        overflowed (a sum past float32's largest would fail every later update). Nothing
        is written: `peek`, then `finish(pending=...)`, decide what is.

        Args:
          grads: The reduced gradients of this call (None: not added).
          variables: The variables they belong to (one copy).
          batch_size: This call's number of examples.

        Returns:
          Per variable, its sum plus the gradient times the batch size (None stays None).

        Raises:
          ValueError: if this call gives gradients to other variables than an earlier call
            (another `tf.function` or trace sharing the accumulator) did.
        """
        self._check_graded(grads, variables)
        found = []
        for var, total, held in self._held(grads, variables, batch_size, None):
            with tf.device(var.device):
                found.append(None if total is None else total + held)
        return found

    @library_code
    def peek(self, sums: list, variables: list, batch_size: Any, keep: Any = None) -> tuple:
        """`add`'s means from `with_call`'s sums, nothing written: held until `finish`.

        So that a call completing `every` calls can have its mean checked (the learning rate,
        the gradient hook's output) before it changes any sum.

        Args:
          sums: From `with_call` (None: nothing added).
          variables: The variables they belong to (one copy).
          batch_size: This call's number of examples (0 for a call that adds nothing).
          keep: Optional boolean scalar: False holds the sums as they are instead.

        Returns:
          `(means, pending)`: per variable, the sum so far with this call's gradients
          divided by the examples so far with its own (None stays None); and what
          `finish(pending=...)` writes.
        """
        examples = tf.cast(self.examples, tf.float32) + tf.cast(batch_size, tf.float32)
        means, pending = [], []
        for added, var in zip(sums, variables):
            if added is None:
                means.append(None)
                continue
            total = self._sums[var.ref()][2]
            with tf.device(var.device):
                if keep is not None:
                    added = tf.where(keep, added, total)
                means.append(added / tf.cast(examples, added.dtype))
            pending.append((total, added))
        return means, pending

    def _held(self, grads: list, variables: list, batch_size: Any, keep: Any) -> list:
        """Per variable: (variable, its sum, this call's gradient times the batch size).

        Dense, zeros where `keep` is False; (variable, None, None) for a None gradient.
        """
        found = []
        for grad, var in zip(grads, variables):
            if grad is None:
                found.append((var, None, None))
                continue
            with tf.device(var.device):
                if isinstance(grad, tf.IndexedSlices):
                    grad = densified(grad, var)
                if keep is not None:
                    grad = tf.where(keep, grad, tf.zeros_like(grad))
                held = grad * tf.cast(batch_size, grad.dtype)
            found.append((var, self._sums[var.ref()][2], held))
        return found

    def _check_graded(self, grads: list, variables: list) -> None:
        """Refuses calls (traces) that give gradients to different variables.

        A sum that some calls fill and the cycle's last call has no gradient for would be
        dropped at the update, the variable not updated.
        """
        for grad, var in zip(grads, variables):
            graded = self._graded.setdefault(var.ref(), grad is not None)
            if graded != (grad is not None):
                name = self._sums[var.ref()][0] if var.ref() in self._sums else var.name
                raise ValueError(
                    f"The calls that share this GradientAccumulator give gradients to different "
                    f"variables: {name} has {'none' if graded else 'one'} in this call and "
                    f"{'one' if graded else 'none'} in an earlier one (another tf.function, or "
                    "another trace). Its sum would be lost at the end of a cycle whose last "
                    "call gives it none. Use one accumulator per set of variables, or make "
                    "every call's loss reach them (times 0 where unused)."
                )

    @library_code
    def finish(
        self,
        ready: tf.Tensor,
        batch_size: Any,
        after: list,
        keep: Any = None,
        *,
        pending: list | None = None,
        applied: Any = True,
    ) -> Any:
        """Counts the call; after an update (`ready`) zeroes the sums and the example count.

        Args:
          ready: From `ready()`, for this call.
          batch_size: This call's number of examples.
          after: Ops that must run first (the update, which reads the sums).
          keep: Optional boolean scalar: False leaves everything as it was (a call that
            fails under "raise": not counted, no reset; the count waits for it on the host).
          pending: From `peek`: the sums with this call's gradients, written where the
            call does not complete `every` calls (one that does is in its mean; or, not
            `applied`, is dropped with its examples).
          applied: A boolean scalar: whether the mean's update was applied; False keeps
            the sums and the examples of a `ready` call as they were.

        Returns:
          The op.
        """
        with tf.control_dependencies(after):
            if pending is not None:
                return self._settled(ready, batch_size, keep, pending, applied)
            if keep is not None:
                ready = tf.logical_and(ready, keep)
            resets = [
                total.assign(tf.where(ready, tf.zeros_like(total), total))
                for _, _, total in self._sums.values()
            ]
            with tf.device(self.calls.device):
                examples = tf.where(ready, 0.0, self.examples + tf.cast(batch_size, tf.float32))
                one = tf.constant(1, tf.int64) if keep is None else tf.cast(keep, tf.int64)
                return tf.group(resets, self.examples.assign(examples), self.calls.assign_add(one))

    def _settled(self, ready, batch_size, keep, pending: list, applied) -> tf.Operation:
        """`finish` for a call held by `peek`: added, or (ready) reset if applied, or kept."""
        with tf.device(self.calls.device):
            writes = tf.constant(True) if keep is None else tf.convert_to_tensor(keep)
            reset = tf.logical_and(tf.logical_and(ready, applied), writes)
            add = tf.logical_and(tf.logical_not(ready), writes)
        added_to = {total.ref(): added for total, added in pending}
        sums = []
        for _, _, total in self._sums.values():  # (a sum this call adds nothing to: reset)
            added = added_to.get(total.ref())
            with tf.device(total.device):
                kept = total if added is None else tf.where(add, added, total)
                sums.append(total.assign(tf.where(reset, tf.zeros_like(total), kept)))
        with tf.device(self.calls.device):
            examples = self.examples + tf.where(add, tf.cast(batch_size, tf.float32), 0.0)
            examples = tf.where(reset, 0.0, examples)
            one = tf.cast(writes, tf.int64)
            return tf.group(sums, self.examples.assign(examples), self.calls.assign_add(one))
