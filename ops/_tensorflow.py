"""Imports TensorFlow once, with one clear message when it is missing."""

try:
    import tensorflow as tf
except ModuleNotFoundError as error:
    if error.name != "tensorflow":
        raise
    raise ImportError(
        "`towers` needs TensorFlow, which is not installed in this environment. Install it with "
        "the package's extra: `pip install 'tf-towers[cpu]'` on a CPU-only machine, or "
        "`pip install 'tf-towers[gpu]'` for NVIDIA GPUs (or install `tensorflow` yourself). The "
        "distribution is named tf-towers; the package named `towers` on PyPI is another project."
    ) from None

__all__ = ["tf"]
