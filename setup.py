"""Installs the distribution `tf-towers`: the import package `towers`, with `towers.ops`.

The pure ops live in the repository's top-level `ops/` folder and install as `towers.ops`; no
top-level `ops` module is installed. TensorFlow comes through extras so that CPU and GPU users
each get the right build:

    pip install ".[cpu]"    # tensorflow-cpu
    pip install ".[gpu]"    # tensorflow[and-cuda], NVIDIA GPUs on Linux
    pip install ".[cpu,test]"  # plus what the test suite needs
    pip install ".[cpu,tensorboard,digits]"  # TensorBoard; the digits example's data
"""

import setuptools

TF_VERSION = ">=2.16,<3"
# The subpackages of `towers`, lowest first (README's "Layout" says what each owns).
WINGS = (
    "workers",
    "core",
    "data",
    "variables",
    "optimizers",
    "step",
    "layers",
    "files",
    "weights",
    "checkpoints",
    "progress",
    "bench",
)

setuptools.setup(
    name="tf-towers",
    version="0.2.0",
    description="Data-parallel training of TensorFlow models on several devices, in graph mode.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=[
        "towers",
        *(f"towers.{wing}" for wing in WINGS),
        "towers.ops",
        "towers.ops._all_reduce",
    ],
    package_dir={"towers.ops": "ops"},
    python_requires=">=3.10",
    install_requires=["numpy", "absl-py"],
    extras_require={
        "cpu": [f"tensorflow-cpu{TF_VERSION}"],
        "gpu": [f"tensorflow[and-cuda]{TF_VERSION}"],
        "tensorboard": ["tensorboard"],  # to view what towers.summary_scalar writes
        "digits": ["scikit-learn"],  # the 8x8 digits of examples/port_multi_gpu_model.py
        "test": ["pytest", "pytest-xdist", "ruff", "h5py", "wheel", "tf-keras", "scikit-learn"],
    },
)
