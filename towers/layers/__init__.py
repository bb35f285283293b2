"""Layers whose statistics span the towers, and noise that ignores how the batch is split.

`BatchNorm` and `batch_moments` take their statistics over every tower; `dropout` and
`example_uniform` draw per example, the same for any number of towers.
"""

from towers.layers._batch_norm import BatchNorm, batch_moments
from towers.layers._noise import dropout, example_uniform

__all__ = [
    "BatchNorm",
    "batch_moments",
    "dropout",
    "example_uniform",
]
