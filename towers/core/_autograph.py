"""Library entry points that call user code back, and that user code, converted as before.

The rule (`towers.ops.internal.library_code`): library code never runs converted. A library
function that calls user code (a loss, a tower function, a gradient hook, a foreign
optimizer) is a `@user_code_entry`: unconverted itself, it remembers whether its caller was
converted, and `as_caller_would(fn)` converts the user's function exactly then, so a Python
`if` on a tensor in a loss still becomes a `tf.cond`. Keras layers do the same with `call`.
"""

import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import tensorflow as tf

from towers.ops.internal import library_code

F = TypeVar("F", bound=Callable[..., Any])

_autograph = tf.__internal__.autograph
_callers = threading.local()  # .status: the AutoGraph status of the outermost library call


def user_code_entry(impl: F) -> F:
    """Runs `impl` unconverted, remembering whether its caller was converted.

    The returned function is short, so AutoGraph converts it cheaply, and its body sees the
    caller's status. A library call made from inside another keeps the outer status: the
    inner one runs unconverted, under AutoGraph's "disabled" status, whatever the user's.
    """
    unconverted = library_code(impl)

    @functools.wraps(impl)
    def entry(*args: Any, **kwargs: Any) -> Any:
        outer = getattr(_callers, "status", None)
        status = _autograph.control_status_ctx()
        if outer is not None and status.status.name == "DISABLED":
            status = outer
        _callers.status = status
        try:
            return unconverted(*args, **kwargs)
        finally:
            _callers.status = outer

    return entry  # type: ignore[return-value]


def as_caller_would(fn: F) -> F:
    """`fn`, converted by AutoGraph if the code that called the library was; else `fn`.

    Args:
      fn: A user's callable, called from inside a `user_code_entry` function.

    Returns:
      A callable with the same arguments and results.
    """
    status = getattr(_callers, "status", None)
    if status is None:
        return fn
    return _autograph.tf_convert(fn, status, convert_by_default=False)
