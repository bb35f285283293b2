"""Imports TensorFlow once, with one clear message when it is missing."""

try:
    import tensorflow as tf
except ModuleNotFoundError as error:
    if error.name != "tensorflow":
        raise
    raise ImportError(
        "`towers` and `ops` need TensorFlow, which is not installed in this environment. "
        "Install it with the package: `pip install 'towers[cpu]'` on a CPU-only machine, or "
        "`pip install 'towers[gpu]'` for NVIDIA GPUs (or install `tensorflow` yourself)."
    ) from None

__all__ = ["tf"]
