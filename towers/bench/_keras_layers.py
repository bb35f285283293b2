"""Keras pieces the benchmark's real models share: dtype policies and seeded initializers.

The library never imports Keras; the models suite of `python -m towers.bench` (a program)
does, here and in `_keras_resnet.py` and `_keras_gpt.py` alone, to measure towers on models
built the way users build them. Nothing imports these modules but that suite.
"""

import keras

# Keras dtype policies by compute dtype: "mixed_bfloat16" keeps variables in float32 and
# computes in bfloat16 (layers cast their inputs and read their variables cast).
POLICIES = {"float32": "float32", "bfloat16": "mixed_bfloat16"}


class Initializers:
    """Seeded initializers, each with its own seed, so that a build is reproducible."""

    def __init__(self, seed: int):
        self._next = seed * 100_000

    def __call__(self, cls=keras.initializers.HeNormal, **kwargs) -> keras.initializers.Initializer:
        """A new initializer of `cls` with the next seed."""
        self._next += 1
        return cls(seed=self._next, **kwargs)


def policy(compute_dtype: str) -> str:
    """The Keras dtype policy of `compute_dtype` ("float32" or "bfloat16")."""
    if compute_dtype not in POLICIES:
        raise ValueError(
            f"`compute_dtype` must be one of {sorted(POLICIES)}; got {compute_dtype!r}."
        )
    return POLICIES[compute_dtype]
