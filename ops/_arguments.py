"""Checking the arguments users pass: one helper per kind, one wording, one error type each.

A value of the wrong type is a `TypeError`; a value out of range (a NaN or an infinity among
numbers) is a `ValueError`. Both name the argument, show the value and say what it may be.
Booleans are not numbers here, and numpy scalars are.
"""

import math
import numbers
from typing import Any


def check_int(
    value: Any,
    name: str,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    none: bool = False,
) -> int | None:
    """`value` as an int, checked.

    Args:
      value: What the user passed.
      name: The argument's name, as the message shows it.
      minimum: The smallest value allowed, if any.
      maximum: The largest value allowed, if any.
      none: Whether None is allowed (and returned).

    Returns:
      The int (or None).

    Raises:
      TypeError: if `value` is not an int (a bool is not).
      ValueError: if it is out of range.
    """
    if value is None and none:
        return None
    wanted = "an int" + _range(minimum, maximum, None, None) + (" or None" if none else "")
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"`{name}` must be {wanted}; got {value!r}.")
    value = int(value)
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise ValueError(f"`{name}` must be {wanted}; got {value}.")
    return value


def check_number(
    value: Any,
    name: str,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    above: float | None = None,
    below: float | None = None,
    none: bool = False,
) -> float | None:
    """`value` as a finite float, checked.

    Args:
      value: What the user passed.
      name: The argument's name, as the message shows it.
      minimum: The smallest value allowed, if any.
      maximum: The largest value allowed, if any.
      above: A bound the value must exceed, if any.
      below: A bound the value must stay under, if any.
      none: Whether None is allowed (and returned).

    Returns:
      The float (or None).

    Raises:
      TypeError: if `value` is not a real number (a bool is not).
      ValueError: if it is NaN, infinite or out of range.
    """
    if value is None and none:
        return None
    wanted = "a finite number" + _range(minimum, maximum, above, below)
    wanted += " or None" if none else ""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"`{name}` must be {wanted}; got {value!r}.")
    value = float(value)
    out = (
        not math.isfinite(value)
        or (minimum is not None and value < minimum)
        or (maximum is not None and value > maximum)
        or (above is not None and value <= above)
        or (below is not None and value >= below)
    )
    if out:
        raise ValueError(f"`{name}` must be {wanted}; got {value!r}.")
    return value


def check_bool(value: Any, name: str) -> bool:
    """`value`, which must be True or False.

    Args:
      value: What the user passed.
      name: The argument's name.

    Returns:
      The bool.

    Raises:
      TypeError: for anything else (1 and "yes" included).
    """
    if not isinstance(value, bool):
        raise TypeError(f"`{name}` must be True or False; got {value!r}.")
    return value


def _range(minimum, maximum, above, below) -> str:
    """The words for a range, e.g. " >= 1", " in [0, 1]", " in (0, 1)", " > 0"."""
    low = (f"[{_shown(minimum)}" if minimum is not None else None) or (
        f"({_shown(above)}" if above is not None else None
    )
    high = (f"{_shown(maximum)}]" if maximum is not None else None) or (
        f"{_shown(below)})" if below is not None else None
    )
    if low and high:
        return f" in {low}, {high}"
    if low:
        return (" >= " if low[0] == "[" else " > ") + low[1:]
    if high:
        return (" <= " if high[-1] == "]" else " < ") + high[:-1]
    return ""


def _shown(bound: float) -> str:
    """An int bound as it is, a float one shortly (1e-07, 3.40282e+38, 0.5)."""
    return str(bound) if isinstance(bound, int) else f"{bound:g}"
