"""The models suite: real models on K devices, every configuration timed interleaved.

`python -m towers.bench --suite=models` runs one process per device count (as the step
suite does); each builds every configuration of `_model_steps` for each model and times them
with `towers.bench._worker.time_interleaved`, printing one row each: milliseconds per step,
images or tokens per second and model FLOP utilisation (of `--peak_tflops` per device).
"""

import functools
import re
import sys
import time
from typing import Any

import tensorflow as tf

from towers.bench._model_steps import ModelFactory, model_rows
from towers.bench._real_models import REAL_MODELS, mean_loss, repeated_dataset
from towers.bench._tables import format_table
from towers.bench._worker import time_interleaved

PEAK_TFLOPS = 790.0  # an H200's dense bfloat16 peak as DESIGN.md takes it, per device


def shared_factory(reference: Any, build: ModelFactory) -> ModelFactory:
    """`build`, with `reference`'s weights copied into each model it makes."""
    weights = reference.get_weights()

    def make_model() -> Any:
        model = build()
        model.set_weights(weights)
        return model

    return make_model


def throughput(
    flops_per_item: float,
    items_per_step: int,
    step_ms: float,
    num_devices: int = 1,
    peak_tflops: float = PEAK_TFLOPS,
) -> tuple[float, float]:
    """(items per second, model FLOP utilisation) of a step.

    Args:
      flops_per_item: Training FLOPs per image or token (`RealModel.flops_per_item`).
      items_per_step: Images, or tokens (batch x sequence), in one global batch.
      step_ms: Milliseconds per step.
      num_devices: Devices sharing the step; the peak is theirs together.
      peak_tflops: One device's peak, in TFLOP/s.

    Returns:
      Items per second, and the achieved FLOP/s as a fraction of the devices' peak.

    Raises:
      ValueError: if `step_ms`, `num_devices` or `peak_tflops` is not positive.
    """
    for name, value in (
        ("step_ms", step_ms),
        ("num_devices", num_devices),
        ("peak_tflops", peak_tflops),
    ):
        if not value > 0:
            raise ValueError(f"`{name}` must be > 0; got {name}={value}.")
    per_second = items_per_step / (step_ms / 1e3)
    return per_second, per_second * flops_per_item / (num_devices * peak_tflops * 1e12)


def suite_rows(
    model_name: str,
    devices: list[str],
    strategy: tf.distribute.Strategy | None,
    *,
    global_batch: int,
    steps: int,
    warmup: int,
    compute_dtype: str = "float32",
    compiled: tuple[bool, ...] = (False, True),
    peak_tflops: float = PEAK_TFLOPS,
    configs: str = ".*",
) -> list[dict]:
    """One row per configuration of `model_name` on `devices`, timed interleaved.

    Builds every configuration (its models from one reference's weights; uncompiled, then
    compiled by XLA, as `compiled` says), then times them with `time_interleaved`:
    "trace_s" is each step's first call (tracing and XLA compilation), "step_ms" the median
    of `steps` calls after `warmup`, "steps_ms" those calls in the order they ran (where a
    median hides a row slow one step in three). Rows fed by the dataset repeat one fixed
    batch. Only the configurations whose label matches the regular expression `configs` are
    built; each one's build and first call are reported on stderr as they end ("bench: ...").

    Raises:
      ValueError: if `model_name` is unknown, or `global_batch` does not split evenly over
        the devices (the peers split with `tf.split`).
    """
    if model_name not in REAL_MODELS:
        raise ValueError(f"`model_name` must be one of {sorted(REAL_MODELS)}; got {model_name!r}.")
    if global_batch % len(devices):
        raise ValueError(
            f"`global_batch` must be a multiple of the number of devices; got "
            f"global_batch={global_batch}, {len(devices)} devices. Use a multiple of it."
        )
    real = REAL_MODELS[model_name]
    build = functools.partial(real.build, compute_dtype=compute_dtype)
    reference = build()
    make_model = shared_factory(reference, build)
    batch = real.batch(global_batch, 0)
    with tf.device("/cpu:0"):
        data = tuple(tf.constant(t) for t in batch)
    pattern, configs = configs, {}
    for jit_compile in compiled:
        dataset = repeated_dataset(batch)
        configs |= model_rows(
            make_model, mean_loss, devices, strategy, dataset, jit_compile=jit_compile
        )
    chosen = {label: c for label, c in configs.items() if re.search(pattern, label)}
    built, build_s = {}, {}
    for label, config in chosen.items():
        began = time.perf_counter()
        built[label] = _announced(f"{model_name} K={len(devices)} {label}", config())
        build_s[label] = time.perf_counter() - began
        print(f"bench: built {label} in {build_s[label]:.1f} s", file=sys.stderr, flush=True)
    flops = real.flops_per_item(reference)
    rows, record = [], {}
    timed = time_interleaved(built, data, steps, warmup, record)
    for label, (trace, seconds, loss) in timed.items():
        items = global_batch * real.items_per_example
        chips = 1 if label.startswith("one device") else _chips(devices)
        per_second, mfu = throughput(flops, items, seconds * 1e3, chips, peak_tflops)
        rows.append(
            dict(
                model=model_name,
                dtype=compute_dtype,
                tf32=tf.config.experimental.tensor_float_32_execution_enabled(),
                towers=len(devices),
                config=label,
                batch=global_batch,
                item=real.item,
                build_s=build_s[label],
                trace_s=trace,
                step_ms=seconds * 1e3,
                steps_ms=[round(t * 1e3, 3) for t in record[label]],  # (in the order they ran)
                per_second=per_second,
                mfu=mfu,
                loss=loss,
            )
        )
    return rows


def _chips(devices: list[str]) -> int:
    """The physical devices `devices` are (logical GPUs split from one GPU are one chip)."""
    gpus = tf.config.list_physical_devices("GPU")
    on_gpus = all(tf.DeviceSpec.from_string(d).device_type == "GPU" for d in devices)
    return min(len(devices), len(gpus)) if on_gpus and gpus else len(devices)


def _announced(label: str, step: Any) -> Any:
    """`step`, reporting on stderr how long its first call (trace, compilation) took."""
    first = []

    def run(data: Any) -> Any:
        began = time.perf_counter()
        out = step(data)
        if not first:
            first.append(time.perf_counter() - began)
            print(f"bench: first call of {label}: {first[0]:.1f} s", file=sys.stderr, flush=True)
        return out

    return run


def _key(row: dict) -> tuple:
    return row["model"], row["dtype"], row["tf32"], row["towers"]


def models_table(rows: list[dict]) -> str:
    """The rows as a table; "x floor" is one device compiled by XLA's time over the row's."""
    header = ["model", "dtype", "K", "configuration", "trace s", "step ms", "items/s", "MFU %"]
    floor = {_key(r): r["step_ms"] for r in rows if r["config"] == "one device xla"}
    lines = []
    for r in rows:
        dtype = r["dtype"] + (" tf32" if r["tf32"] and r["dtype"] == "float32" else "")
        ratio = floor[_key(r)] / r["step_ms"] if _key(r) in floor else "-"
        lines.append(
            (
                r["model"],
                dtype,
                r["towers"],
                r["config"],
                r["trace_s"],
                r["step_ms"],
                f"{r['per_second']:.4g} {r['item']}",
                100 * r["mfu"],
                ratio,
                f"{r['loss']:.6g}",
            )
        )
    return format_table([*header, "x floor", "loss"], lines)


# (what, towers' rows, the peer, the bound on towers' time over the peer's, the device counts
# it holds for: "1", "K>1" or "all"): issue #32's targets, with the default non-finite guard.
_OURS_XLA, _OURS = ("towers replicated xla",), ("towers replicated", "towers ps")
TARGETS = (
    ("XLA vs one device compiled whole", _OURS_XLA, "one device xla", 1.03, "1"),
    ("XLA vs MirroredStrategy compiled", _OURS_XLA, "mirrored xla", 0.95, "K>1"),
    ("XLA vs MirroredStrategy compiled", _OURS_XLA, "mirrored xla", None, "1"),
    ("XLA vs MirroredStrategy, whole replica", _OURS_XLA, "mirrored xla, whole replica", None, "1"),
    ("XLA vs the hand-written loop, update compiled", _OURS_XLA,
     "hand-written towers xla, update compiled", None, "all"),
    ("the guard's cost (XLA)", _OURS_XLA, "towers replicated xla, no guard", 1.02, "all"),
    ("the update compiled (XLA)", _OURS_XLA, "towers replicated xla, update uncompiled", None,
     "all"),
    ("the guard's cost (no XLA)", ("towers replicated",), "towers replicated, no guard", 1.02,
     "all"),
    ("no XLA vs MirroredStrategy", _OURS, "mirrored", 1.00, "all"),
    ("no XLA vs one device", _OURS, "one device", 1.02, "all"),
)  # fmt: skip


def _holds_for(devices: str, k: int) -> bool:
    return devices == "all" or (devices == "1") == (k == 1)


def target_ratios(rows: list[dict]) -> list[tuple[tuple, str, float, float | None]]:
    """Each target's ratio in `rows` (one process's): (row key, target, towers / peer, bound).

    The ratio is towers' fastest row of the target's kind over its peer's time.
    """
    by = {(_key(r), r["config"]): r["step_ms"] for r in rows}
    ratios = []
    for key in sorted({_key(r) for r in rows}):
        for what, ours, peer, bound, devices in TARGETS:
            mine = [by[key, label] for label in ours if (key, label) in by]
            if not mine or (key, peer) not in by or not _holds_for(devices, key[3]):
                continue
            ratios.append((key, what, min(mine) / by[key, peer], bound))
    return ratios


def verdict(ratio: float, bound: float | None) -> str:
    """The word for `ratio` against `bound`: met, NOT met, or - where there is no bound."""
    return "-" if bound is None else ("met" if ratio <= bound else "NOT met")


def targets_table(rows: list[dict]) -> str:
    """Towers' fastest row of each kind over its peer's time, with the bound it must meet."""
    lines = []
    for key, what, ratio, bound in target_ratios(rows):
        shown = "-" if bound is None else bound
        lines.append((key[0], key[1], key[3], what, ratio, shown, verdict(ratio, bound)))
    header = ["model", "dtype", "K", "target", "towers / peer", "bound", ""]
    return format_table(header, lines)
