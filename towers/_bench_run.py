"""A benchmark worker: times every configuration on K devices in this process."""

import statistics
import time

import ops
from ops._tensorflow import tf
from towers._bench_models import MODELS, batch
from towers._bench_steps import configurations
from towers._devices import list_devices, simulate_devices

DEFAULT_BATCH = {"mlp": 1024, "cnn": 256, "many_small": 1024}


def run_worker(
    num_devices: int,
    *,
    models: list[str],
    batch_size: int,
    steps: int,
    warmup: int,
    algorithms: list[str],
    bucket_bytes: int | None,
) -> list[dict]:
    """One row per (model, configuration) on `num_devices` devices.

    Simulates the devices on the CPU when there is no GPU; must run in a fresh process.
    """
    if not tf.config.list_physical_devices("GPU"):
        simulate_devices(num_devices)
    devices = list_devices(num=num_devices)
    strategy = tf.distribute.MirroredStrategy(devices)
    rows = []
    for model in models:
        size = batch_size or DEFAULT_BATCH[model]
        data = batch(MODELS[model], size)
        for label, build in configurations(algorithms, bucket_bytes, strategy).items():
            step = build(model, devices)
            trace, seconds = _time(step, data, steps, warmup)
            rows.append(
                {
                    "model": model,
                    "towers": num_devices,
                    "config": label,
                    "batch": size,
                    "trace_s": trace,
                    "step_ms": seconds * 1e3,
                    "all_reduces": _all_reduces(label, model, bucket_bytes),
                }
            )
    return rows


def _time(step, data, steps: int, warmup: int) -> tuple[float, float]:
    """(first-call seconds, median step seconds)."""
    began = time.perf_counter()
    float(step(data))
    trace = time.perf_counter() - began
    for _ in range(warmup):
        float(step(data))
    times = []
    for _ in range(steps):
        began = time.perf_counter()
        float(step(data))
        times.append(time.perf_counter() - began)
    return trace, statistics.median(times)


def _all_reduces(label: str, model: str, bucket_bytes: int | None) -> int | None:
    """All-reduces per device and step of a replicated configuration (its buckets)."""
    if "replicated" not in label:
        return None
    variables = MODELS[model]().trainable_variables
    if bucket_bytes is None:
        return len(variables)
    return len(ops.pack_spec([tf.convert_to_tensor(v) for v in variables], bucket_bytes).buckets)
