"""The AutoGraph rule of `towers` and `towers.ops`: library code is never converted.

Inside `tf.function`, AutoGraph converts each function the traced code calls, and what
converted code calls in turn. The library's functions are graph code already (they also
build v1 graphs); converting them costs most of a first trace and changes nothing. A
function that user code may call (every public function and method) is marked with
`library_code`; what it calls is then left alone too. User code that the library calls back
(a loss, a hook) is converted as its caller was: `towers.core.as_caller_would`. A test
traces the public stages from converted user code and fails when any library function runs
converted.
"""

from collections.abc import Callable
from typing import Any, TypeVar

from towers.ops._tensorflow import tf

F = TypeVar("F", bound=Callable[..., Any])


def library_code(fn: F) -> F:
    """Marks `fn` as library code: AutoGraph calls it as it is, and nothing it calls.

    Args:
      fn: A function or method of `towers` or `towers.ops`.

    Returns:
      `fn`, marked (`tf.autograph.experimental.do_not_convert`).
    """
    return tf.autograph.experimental.do_not_convert(fn)
