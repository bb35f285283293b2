"""A device scope that leaves the caller's scope alone when no device is given."""

import contextlib

from towers.ops._tensorflow import tf


def device_scope(device: str | None) -> contextlib.AbstractContextManager:
    """`tf.device(device)`, or no scope at all for None or "".

    `tf.device(None)` would clear the caller's device scope in a graph; here None means "keep
    whatever the caller chose".
    """
    return tf.device(device) if device else contextlib.nullcontext()
