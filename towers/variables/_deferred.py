"""State updates a step defers to its verdict (BatchNorm's moving averages).

A tower updates state beside the weights while it is built (the forward pass), before the
step knows whether its gradients are finite. Inside `deferred_state_updates()` (opened by
`towers.train_step`) such updates are handed over instead, and the step builds them with
the optimizer's: skipped with the update, or after its checks.
"""

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import tensorflow as tf

_local = threading.local()  # graphs are built per thread


@contextlib.contextmanager
def deferred_state_updates() -> Iterator[list[Callable[[], Any]]]:
    """Collects the state updates built inside; yields their list (callables)."""
    stack = _local.__dict__.setdefault("stack", [])
    stack.append([])
    try:
        yield stack[-1]
    finally:
        stack.pop()


def defer_state_update(update: Callable[[], Any], device: str | None) -> bool:
    """Hands `update` (built later under `device`) to the step; False: build it now."""
    stack = getattr(_local, "stack", None)
    if not stack:
        return False

    def placed() -> Any:
        with tf.device(device):
            return update()

    stack[-1].append(placed if device else update)
    return True
