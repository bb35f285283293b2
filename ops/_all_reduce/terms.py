"""Each device's terms of an all-reduce's sum (`AllReduce.sum_terms` past its checks)."""


def terms_of(algorithm, values: list, devices: list, wire_dtype) -> list[list]:
    """`algorithm`'s own terms (its `_terms`), or each device's `sum` alone.

    A subclass that overrides only `sum` (of `AutoAllReduce`, say) gets its own sums, whatever
    an ancestor's `_terms` would have done past it.
    """
    if _own_terms(algorithm):
        return algorithm._terms(values, devices, wire_dtype)
    return [[total] for total in algorithm.sum(values, devices, wire_dtype)]


def sends_values(algorithm, values: list, devices: list) -> bool:
    """Whether `sum_terms` gives every device the values themselves, none added on the way.

    Then the values may travel in a narrower dtype than their sum is taken in (half-precision
    values that are exactly float32 gradients, `towers.ops._exact_widening`): nothing is
    added before the device that uses the sum widens them. `GatherAddAllReduce` on two
    devices does (and `AutoAllReduce` where it takes it); a subclass that overrides `sum`
    does not.
    """
    if algorithm.group_size(len(values)) == 1:
        return True  # the value alone
    sends = getattr(algorithm, "_sends_values", None)
    return _own_terms(algorithm) and sends is not None and sends(values, devices)


def _own_terms(algorithm) -> bool:
    """Whether `algorithm`'s `_terms` is the one its `sum` goes with (not below an override)."""
    mro = type(algorithm).__mro__
    sum_owner = next(i for i, c in enumerate(mro) if "sum" in vars(c))
    terms_owner = next((i for i, c in enumerate(mro) if "_terms" in vars(c)), None)
    return terms_owner is not None and terms_owner <= sum_owner
