"""Benchmarks, run as `python -m towers.bench`; prints a table. Not imported by `towers`.

    python -m towers.bench --suite=weights --weights_mb=100

Suites:
  weights: time to save and to restore a set of float32 weights in each format.
"""

import os
import shutil
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

import towers  # noqa: E402
from ops._tensorflow import tf  # noqa: E402

_SUITE = flags.DEFINE_enum("suite", "weights", ["weights"], "What to measure.")
_WEIGHTS_MB = flags.DEFINE_integer("weights_mb", 100, "Size of the weights (weights suite).")
_NUM_VARIABLES = flags.DEFINE_integer("num_variables", 20, "Variables the weights are split in.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Runs per measurement; the median is shown.")
_DIRECTORY = flags.DEFINE_string("directory", None, "Where to write; default a temp dir.")

FORMATS = {"npz": "weights.npz", "h5": "weights.h5", "checkpoint": "weights_ckpt"}


def weights_table(megabytes: int, num_variables: int, repeats: int, directory: str) -> list:
    """Rows of (format, MB on disk, median save s, median restore s, MB/s save, MB/s restore)."""
    per_variable = megabytes * 2**20 // 4 // num_variables
    rng = np.random.default_rng(0)
    variables = {
        f"layer_{i}/w": tf.Variable(rng.standard_normal(per_variable, np.float32))
        for i in range(num_variables)
    }
    total_mb = sum(v.shape.num_elements() * 4 for v in variables.values()) / 2**20
    rows = []
    for name, file_name in FORMATS.items():
        path = os.path.join(directory, file_name)
        save = _median_seconds(lambda p=path: towers.save_weights(variables, p), repeats)
        restore = _median_seconds(lambda p=path: towers.restore_weights(variables, p), repeats)
        rows.append((name, _size_mb(path), save, restore, total_mb / save, total_mb / restore))
    return rows


def _median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def _size_mb(path: str) -> float:
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(path, n)) for n in os.listdir(path)) / 2**20
    return os.path.getsize(path) / 2**20


def format_table(header: list[str], rows: list[tuple]) -> str:
    """A plain-text table, numbers with two decimals."""
    cells = [header] + [[f"{c:.2f}" if isinstance(c, float) else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells)


def main(argv: list[str]) -> None:
    """Runs the chosen suite and prints its table."""
    del argv
    directory = _DIRECTORY.value or tempfile.mkdtemp(prefix="towers-bench-")
    try:
        rows = weights_table(_WEIGHTS_MB.value, _NUM_VARIABLES.value, _REPEATS.value, directory)
    finally:
        if _DIRECTORY.value is None:
            shutil.rmtree(directory, ignore_errors=True)
    print(
        f"weights: {_WEIGHTS_MB.value} MB float32 in {_NUM_VARIABLES.value} variables, "
        f"median of {_REPEATS.value}"
    )
    print(
        format_table(
            ["format", "disk MB", "save s", "restore s", "save MB/s", "restore MB/s"], rows
        )
    )


if __name__ == "__main__":
    app.run(main)
