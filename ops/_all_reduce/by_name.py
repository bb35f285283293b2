"""All-reduce algorithms by name."""

from towers.ops._all_reduce.base import AllReduce
from towers.ops._all_reduce.flat import FLAT
from towers.ops._all_reduce.hierarchical import HierarchicalAllReduce
from towers.ops._autograph import library_code

_CLASSES = {**FLAT, HierarchicalAllReduce.name: HierarchicalAllReduce}
ALGORITHMS = tuple(sorted(_CLASSES))


@library_code
def all_reduce_algorithm(algorithm: str | AllReduce) -> AllReduce:
    """A new instance of the algorithm named `algorithm`, or `algorithm` itself.

    Each call with a name returns a new instance with its own keys and tokens: whoever holds
    it (a `towers.Replicated`, say) shares it with nobody.

    Args:
      algorithm: One of `ops.ALGORITHMS`, or an `ops.AllReduce` instance.

    Returns:
      An `AllReduce`.

    Raises:
      ValueError: if the name is unknown.
      TypeError: if `algorithm` is neither a name nor an `AllReduce`.

    Example:
      >>> ops.all_reduce_algorithm("ring")
      <...RingAllReduce object at ...>
    """
    if isinstance(algorithm, AllReduce):
        return algorithm
    if not isinstance(algorithm, str):
        raise TypeError(
            f"`algorithm` must be a name from {ALGORITHMS} or an ops.AllReduce; got "
            f"{type(algorithm).__name__}."
        )
    if algorithm not in _CLASSES:
        raise ValueError(f"`algorithm` must be one of {ALGORITHMS}; got {algorithm!r}.")
    return _CLASSES[algorithm]()
