"""Watching a run: scalars for TensorBoard, step times, evaluation on every device."""

from towers.progress._evaluate import Evaluation, evaluate
from towers.progress._step_timer import StepTimer
from towers.progress._summaries import summary_scalar

__all__ = [
    "Evaluation",
    "StepTimer",
    "evaluate",
    "summary_scalar",
]
