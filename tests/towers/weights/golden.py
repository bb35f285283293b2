"""The committed golden weights file: its path and the values it must keep loading as."""

import os

import numpy as np

PATH = os.path.join(os.path.dirname(__file__), "..", "..", "data", "golden_weights.npz")


def values() -> dict[str, np.ndarray]:
    """What tests/data/golden_weights.npz holds, computed, not read."""
    return {
        "encoder/layers/0/w": (np.arange(12, dtype=np.float32).reshape(3, 4) - 5.5) / 8,
        "encoder/layers/0/b": np.array([0.5, -0.25, 1.0, 0.0], np.float32),
        "head/w": np.linspace(-1, 1, 8, dtype=np.float32).reshape(4, 2),
        "step": np.array(1234, np.int64),
    }
