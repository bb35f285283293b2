"""The tower context: which tower the code being built belongs to."""

import contextlib
import dataclasses
import threading
from collections.abc import Iterator
from typing import Any

from towers.ops.internal import library_code

_local = threading.local()


@dataclasses.dataclass(frozen=True)
class TowerContext:
    """Describes the tower being built; entered by `replicate` around each call of `fn`.

    Use it as a context manager; nesting is refused. Tower code reads it with `current_tower()`.

    Attributes:
      index: The tower's index, 0 to `num_towers - 1`.
      device: The tower's canonical device name.
      num_towers: How many towers are being built.
      name_scope: The tower's name scope as entered (e.g. "tower_1/"), "" if none.
      variable_strategy: The `towers.VariableStrategy` the tower is built with, or None;
        `tower_gradients` and `variable_list` use it when not given one.
      devices: Every tower's device, in tower order (what `towers.cross_tower_sum` spans);
        empty when unknown.
      compiled: Whether the tower's code runs compiled by XLA (`jit_compile=True`): it
        cannot meet other towers mid-way (`towers.cross_tower_sum` refuses).
    """

    index: int
    device: str
    num_towers: int
    name_scope: str = ""
    variable_strategy: Any = None
    devices: tuple[str, ...] = ()
    compiled: bool = False

    def __post_init__(self):
        if not 0 <= self.index < self.num_towers:
            raise ValueError(
                f"`index` must be in [0, num_towers); got index={self.index}, "
                f"num_towers={self.num_towers}."
            )
        if self.devices and len(self.devices) != self.num_towers:
            raise ValueError(
                f"`devices` must hold one device per tower; got {len(self.devices)} for "
                f"num_towers={self.num_towers}."
            )

    @property
    def is_chief(self) -> bool:
        """Whether this is the first tower, the one that creates variables."""
        return self.index == 0

    def __enter__(self) -> "TowerContext":
        active = current_tower()
        if active is not None:
            raise RuntimeError(
                f"Towers do not nest: tower {self.index} was entered inside tower "
                f"{active.index}. Call towers.replicate from outside any tower."
            )
        _local.tower = self
        return self

    def __exit__(self, *exc_info) -> None:
        _local.tower = None


@library_code
def current_tower() -> TowerContext | None:
    """The `TowerContext` being built in this thread, or None outside any tower.

    Returns:
      The context `replicate` entered around the tower function being called, or None.

    Example:
      >>> def tower_fn(shard):
      ...     if towers.current_tower().is_chief:
      ...         tf.summary.histogram("logits", logits)
    """
    return getattr(_local, "tower", None)


@contextlib.contextmanager
def compiling() -> Iterator[TowerContext | None]:
    """Marks the current tower as compiled (`TowerContext.compiled`) inside; yields it.

    For the code of a tower that compiles part of itself (`tower_gradients(jit_compile=True)`
    in a tower built uncompiled). Outside towers, it does nothing and yields None.
    """
    tower = current_tower()
    if tower is None or tower.compiled:
        yield tower
        return
    _local.tower = dataclasses.replace(tower, compiled=True)
    try:
        yield _local.tower
    finally:
        _local.tower = tower
