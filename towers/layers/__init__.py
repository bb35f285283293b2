"""Layers whose statistics span the towers: `BatchNorm` and `batch_moments`."""

from towers.layers._batch_norm import BatchNorm, batch_moments

__all__ = [
    "BatchNorm",
    "batch_moments",
]
