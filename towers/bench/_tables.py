"""The benchmark's tables."""

import os
import shutil
import statistics
import tempfile
import time

import numpy as np
import tensorflow as tf

import towers

WEIGHT_FORMATS = {"npz": "weights.npz", "h5": "weights.h5", "checkpoint": "weights_ckpt"}


def step_table(rows: list[dict]) -> str:
    """Step times with ratios to one device and to MirroredStrategy of the same model and K."""
    base = {(r["model"], r["towers"], r["config"]): r["step_ms"] for r in rows}
    header = [
        "model",
        "K",
        "configuration",
        "step ms",
        "examples/s",
        "trace s",
        "x one device",
        "x mirrored",
        "all-reduces",
        "state KiB/dev",
        "loss",
    ]
    lines = []
    for r in rows:
        one = base.get((r["model"], r["towers"], "one device"))
        mirrored = base.get((r["model"], r["towers"], "mirrored strategy"))
        lines.append(
            (
                r["model"],
                r["towers"],
                r["config"],
                r["step_ms"],
                r["batch"] / r["step_ms"] * 1e3,
                r["trace_s"],
                one / r["step_ms"] if one else "-",
                mirrored / r["step_ms"] if mirrored else "-",
                r["all_reduces"] if r["all_reduces"] is not None else "-",
                r["state_kb"] if r.get("state_kb") is not None else "-",
                f"{r['loss']:.7g}",
            )
        )
    note = (
        "x one device, x mirrored: that time divided by this row's (above 1: this row is "
        "faster). all-reduces: per device and step. state KiB/dev: the optimizer state of "
        "the device holding the most (sharded: a share). loss: the last step's, the same for "
        f"every configuration (same weights, data, steps and rule: {rows[0]['optimizer']}). "
        f"Devices: {_devices_seen(rows)}; TensorFloat-32 {'on' if rows[0]['tf32'] else 'off'}."
    )
    return format_table(header, lines) + "\n" + note


def _devices_seen(rows: list[dict]) -> str:
    """The devices of the largest K, e.g. "/device:GPU:0 ... /device:GPU:3"."""
    devices = max((r["devices"] for r in rows), key=len)
    return devices[0] if len(devices) == 1 else f"{devices[0]} ... {devices[-1]}"


HAND_WRITTEN = "hand-written towers"
STEP_TARGET, TRACE_TARGET = 0.9, 1.1  # issue 12: towers' best / the hand-written loop's


def targets_table(rows: list[dict]) -> str:
    """Per model and K: towers' best step against the hand-written loop's, and trace times.

    In `tf.function` and in v1 sessions alike: the fastest `towers` configuration's step time
    divided by the hand-written tower loop's (target <= 0.9), and the first call of `towers`
    with a parameter server divided by the hand-written loop's (target <= 1.1).
    """
    lines = []
    for model, k in dict.fromkeys((r["model"], r["towers"]) for r in rows):
        mine = [r for r in rows if (r["model"], r["towers"]) == (model, k)]
        for suffix, way in (("", "tf.function"), (" (v1 session)", "v1 session")):
            hand = _row(mine, HAND_WRITTEN + suffix)
            ours = [r for r in mine if r["config"].startswith("towers ") and _way(r) == suffix]
            if hand is None or not ours:
                continue
            best = min(ours, key=lambda r: r["step_ms"])
            ratio = best["step_ms"] / hand["step_ms"]
            trace = _row(mine, "towers ps" + suffix)
            traced = trace["trace_s"] / hand["trace_s"] if trace else None
            lines.append(
                (
                    model,
                    k,
                    way,
                    hand["step_ms"],
                    best["step_ms"],
                    best["config"].removesuffix(suffix).removeprefix("towers "),
                    ratio,
                    "yes" if ratio <= STEP_TARGET else "no",
                    traced if traced is not None else "-",
                    "-" if traced is None else ("yes" if traced <= TRACE_TARGET else "no"),
                )
            )
    header = [
        "model",
        "K",
        "run by",
        "hand-written ms",
        "towers' best ms",
        "towers' best",
        "ratio",
        f"<= {STEP_TARGET}",
        "trace ratio (ps)",
        f"<= {TRACE_TARGET}",
    ]
    note = (
        "ratio: towers' fastest configuration's step time / the hand-written loop's, run the "
        "same way. trace ratio: first call of `towers ps` / the hand-written loop's."
    )
    return format_table(header, lines) + "\n" + note


def _row(rows: list[dict], config: str) -> dict | None:
    return next((r for r in rows if r["config"] == config), None)


def _way(row: dict) -> str:
    return " (v1 session)" if row["config"].endswith(" (v1 session)") else ""


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
    for name, file_name in WEIGHT_FORMATS.items():
        path = os.path.join(directory, file_name)
        save = _median_seconds(lambda p=path: towers.save_weights(variables, p), repeats)
        restore = _median_seconds(lambda p=path: towers.restore_weights(variables, p), repeats)
        rows.append((name, _size_mb(path), save, restore, total_mb / save, total_mb / restore))
    return rows


def weights_report(megabytes: int, num_variables: int, repeats: int) -> str:
    """The weights table, measured in a temporary directory."""
    directory = tempfile.mkdtemp(prefix="towers-bench-")
    try:
        rows = weights_table(megabytes, num_variables, repeats, directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    title = f"weights: {megabytes} MB float32 in {num_variables} variables, median of {repeats}"
    header = ["format", "disk MB", "save s", "restore s", "save MB/s", "restore MB/s"]
    return title + "\n" + format_table(header, rows)


def format_table(header: list[str], rows: list[tuple]) -> str:
    """A plain-text table, floats with two decimals, columns at least two spaces apart."""
    cells = [header] + [[f"{c:.2f}" if isinstance(c, float) else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells)


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
