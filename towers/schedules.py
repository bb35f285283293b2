"""Learning-rate schedules: `towers.schedules.CosineDecay(0.1, 1000)`, ... (`import towers`).

Each is a callable of the optimizer's step count (the number of updates done, 0 for the
first); give one as an optimizer's `learning_rate`. `LinearWarmup` ramps into any of them.
"""

from towers.optimizers.schedules import (
    Constant,
    CosineDecay,
    ExponentialDecay,
    LinearWarmup,
    PiecewiseConstant,
    Schedule,
)

__all__ = [
    "Constant",
    "CosineDecay",
    "ExponentialDecay",
    "LinearWarmup",
    "PiecewiseConstant",
    "Schedule",
]
