"""State updates a step defers to its verdict (BatchNorm's moving averages).

A tower updates state beside the weights while it is built (the forward pass), before the
step knows whether its gradients are finite. Inside `deferred_state_updates()` (opened by
`towers.train_step`) such updates are handed over instead, and the step builds them with
the optimizer's: skipped with the update, or after its checks.

An update is a function of tensors the tower computed (`inputs`), built later: it must
close over nothing but Python values and variables. So a tower compiled by XLA (its own
function graph) can hand its updates out: it returns their inputs, and the update is built
outside on them. What an update needs from the other towers (BatchNorm's whole-batch
statistics) is its `prepare`: run in the tower but outside any compiled program.
"""

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import tensorflow as tf

_local = threading.local()  # graphs are built per thread


@dataclasses.dataclass(frozen=True)
class DeferredUpdate:
    """A state update to build later: `update(*inputs)` under `device`.

    Attributes:
      update: Builds the update from the tensors `inputs` (their values, in order).
      device: Where to build it; None keeps the caller's scope.
      inputs: The tensors the tower computed for it.
      prepare: None, or what turns `inputs` into the update's inputs in the tower, outside
        any compiled program (an exchange with the other towers); not yet run.
      writes: The variables the update writes (the non-finite guard writes them back where
        a step is not finite, on the device); None when unknown (the guard then runs the
        update under `tf.cond`, a host round trip).
    """

    update: Callable[..., Any]
    device: str | None
    inputs: tuple[tf.Tensor, ...]
    prepare: Callable[..., Any] | None = None
    writes: tuple[tf.Variable, ...] | None = None

    def __call__(self) -> Any:
        """Builds the update (its `prepare` first, if it has not run)."""
        with tf.device(self.device) if self.device else contextlib.nullcontext():
            inputs = self.prepare(*self.inputs) if self.prepare else self.inputs
            return self.update(*inputs)


@dataclasses.dataclass
class _Collection:
    updates: list[DeferredUpdate]
    prepared: bool  # whether `prepare` runs when an update is handed in


@contextlib.contextmanager
def deferred_state_updates(*, prepared: bool = True) -> Iterator[list[DeferredUpdate]]:
    """Collects the state updates built inside; yields their list.

    Args:
      prepared: Whether each update's `prepare` runs as it is handed in (False inside a
        compiled program, whose updates are prepared after it ran).
    """
    stack = _local.__dict__.setdefault("stack", [])
    stack.append(_Collection([], prepared))
    try:
        yield stack[-1].updates
    finally:
        stack.pop()


def defers_state_updates() -> bool:
    """Whether state updates built now are deferred (inside `deferred_state_updates`)."""
    return bool(getattr(_local, "stack", None))


def defer_state_update(
    update: Callable[..., Any],
    device: str | None,
    inputs: Sequence[tf.Tensor] = (),
    prepare: Callable[..., Any] | None = None,
    *,
    writes: Sequence[tf.Variable] | None = None,
) -> bool:
    """Hands `update(*prepare(*inputs))` (built later under `device`) to the step.

    Args:
      update: Builds the update from its inputs; it closes over no tensor of its own.
      device: Where to build it, or None.
      inputs: The tensors it is built from.
      prepare: None, or turns `inputs` into the update's inputs (see `DeferredUpdate`).
      writes: The variables it writes (see `DeferredUpdate`).

    Returns:
      Whether the update was deferred; False: the caller builds it now (`prepare` first).
    """
    if not defers_state_updates():
        return False
    collection = _local.stack[-1]
    if prepare is not None and collection.prepared:
        inputs, prepare = prepare(*inputs), None
    writes = None if writes is None else tuple(writes)
    collection.updates.append(DeferredUpdate(update, device, tuple(inputs), prepare, writes))
    return True
