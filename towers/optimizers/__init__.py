"""Optimizers: one short class per rule on a shared base, and learning-rate schedules.

`Optimizer` keeps state per variable and per copy, named like weight files; each rule
(`SGD`, `Adam`, `AdamW`, `RMSProp`, `Adagrad`, `LAMB`, `LARS`) implements one `update`.
`towers.optimizers.schedules` (also `towers.schedules`) holds the schedules.
"""

from towers.optimizers import schedules
from towers.optimizers._adagrad import Adagrad
from towers.optimizers._adam import Adam, AdamW
from towers.optimizers._checks import (
    AppliesGradients,
    check_checkpointable,
    is_keras,
)
from towers.optimizers._device_updates import Judged
from towers.optimizers._lamb import LAMB
from towers.optimizers._lars import LARS
from towers.optimizers._optimizer import Optimizer
from towers.optimizers._rmsprop import RMSProp
from towers.optimizers._sgd import SGD

__all__ = [
    "Adagrad",
    "Adam",
    "AdamW",
    "AppliesGradients",
    "Judged",
    "LAMB",
    "LARS",
    "Optimizer",
    "RMSProp",
    "SGD",
    "check_checkpointable",
    "is_keras",
    "schedules",
]
