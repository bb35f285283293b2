"""Devices and towers: finding and simulating devices, the tower context, sums across towers.

What every other wing builds on: device names (`list_devices`, `simulate_devices`,
`session_config`), the context a tower is built in (`TowerContext`, `current_tower`), the
exchange between towers being built (`cross_tower_sum`), and the AutoGraph rule (library
code runs unconverted; the user code it calls is converted as its caller was).
"""

from towers.core._autograph import as_caller_would, library_code, user_code_entry
from towers.core._cross_tower import cross_tower_sum
from towers.core._devices import (
    canonical_device,
    check_devices_exist,
    device_list,
    list_devices,
    session_config,
    simulate_devices,
)
from towers.core._examples import examples_from, first_example
from towers.core._tower_context import TowerContext, compiling, current_tower

__all__ = [
    "TowerContext",
    "as_caller_would",
    "canonical_device",
    "check_devices_exist",
    "compiling",
    "cross_tower_sum",
    "current_tower",
    "device_list",
    "examples_from",
    "first_example",
    "library_code",
    "list_devices",
    "session_config",
    "simulate_devices",
    "user_code_entry",
]
