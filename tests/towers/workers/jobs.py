"""A job of `program.py`'s "jobs" mode: importable without starting a worker (as `program` does)."""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Job:
    """One run of a mode: where it writes, each worker's batch size, and its options."""

    mode: str
    out: str
    sizes: tuple = ()
    local_first: bool = True  # hierarchical (each worker sums its towers first) or flat
    sharded: bool = False  # the optimizer state over every worker's towers
    poison: int = -1  # the step at which worker 1's loss is NaN (-1: none)
    name: str = "end"  # the closing barrier's
    after: str = ""  # a job of another cluster whose end this one waits for: its OUT
