"""The training step: build the towers, take their gradients, reduce and apply them.

`replicate` builds one tower per device; `train_step` composes a whole step from it,
`tower_gradients`, a strategy's reduction and `apply_reduced` (the gradient hook, the
finiteness guard, the optimizer); micro-batches, `GradientAccumulator` and loss scaling
(`LossScale`, `DynamicLossScale`) are options of that step.
"""

from towers.step._accumulator import GradientAccumulator
from towers.step._apply_reduced import apply_reduced
from towers.step._loss_scale import DynamicLossScale, LossScale
from towers.step._reduce import apply_replicated
from towers.step._tower_builder import replicate
from towers.step._tower_gradients import tower_gradients
from towers.step._train_step import train_step, variable_list

__all__ = [
    "DynamicLossScale",
    "GradientAccumulator",
    "LossScale",
    "apply_reduced",
    "apply_replicated",
    "replicate",
    "tower_gradients",
    "train_step",
    "variable_list",
]
