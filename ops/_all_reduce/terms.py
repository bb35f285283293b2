"""Each device's terms of an all-reduce's sum (`AllReduce.sum_terms` past its checks)."""


def terms_of(algorithm, values: list, devices: list, wire_dtype) -> list[list]:
    """`algorithm`'s own terms (its `_terms`), or each device's `sum` alone.

    A subclass that overrides only `sum` (of `AutoAllReduce`, say) gets its own sums, whatever
    an ancestor's `_terms` would have done past it.
    """
    mro = type(algorithm).__mro__
    sum_owner = next(i for i, c in enumerate(mro) if "sum" in vars(c))
    terms_owner = next((i for i, c in enumerate(mro) if "_terms" in vars(c)), None)
    if terms_owner is not None and terms_owner <= sum_owner:
        return algorithm._terms(values, devices, wire_dtype)
    return [[total] for total in algorithm.sum(values, devices, wire_dtype)]
