"""A benchmark worker: times every configuration on K devices in this process."""

import random
import statistics
import sys
import time
from collections.abc import Callable

import tensorflow as tf

import towers
from towers import ops
from towers.bench._models import MODELS, batch
from towers.bench._steps import configurations, towers_optimizer

DEFAULT_BATCH = {"mlp": 1024, "cnn": 256, "many_small": 1024}
# The trace-time target's pair: their first calls are the median of `trace_builds` fresh
# builds (the first call of each in the timed run, then new ones, alternating), since one
# first call swings by tens of percent with the process's one-time costs and the machine.
TRACE_PAIR = ("hand-written towers", "towers ps")
RETRACED = {f"{label}{way}" for label in TRACE_PAIR for way in ("", " (v1 session)")}


def run_worker(
    num_devices: int,
    *,
    models: list[str],
    batch_size: int,
    steps: int,
    warmup: int,
    algorithms: list[str],
    bucket_bytes: int | None,
    optimizer: str = "sgd",
    trace_builds: int = 3,
) -> list[dict]:
    """One row per (model, configuration) on `num_devices` devices.

    Simulates the devices on the CPU when there is no GPU; must run in a fresh process.
    Every configuration starts from the same weights and trains on the same batch for the
    same number of steps, so their last losses agree (the row's "loss"). An algorithm that
    cannot run on these devices (`nccl` on CPUs or on logical GPUs of one GPU) has no row.
    """
    devices = bench_devices(num_devices)
    strategy = mirrored_strategy(devices)
    algorithms = runnable(algorithms, devices)
    rows = []
    for model in models:
        size = batch_size or DEFAULT_BATCH[model]
        data = batch(MODELS[model], size)
        numpy_data = tuple(t.numpy() for t in data)
        compared = configurations(algorithms, bucket_bytes, strategy, optimizer, numpy_data)
        built = {label: build(model, devices) for label, build in compared.items()}
        timed = time_interleaved(built, data, steps, warmup)
        traces = {label: [first] for label, (first, _, _) in timed.items()}
        retraced = [label for label in compared if label in RETRACED]
        for _ in range(trace_builds - 1):  # fresh builds of the targets' pair, in turn
            for label in retraced:
                began = time.perf_counter()
                compared[label](model, devices)(data)
                traces[label].append(time.perf_counter() - began)
        for label, (_, seconds, loss) in timed.items():
            trace = statistics.median(traces[label])
            rows.append(
                {
                    "model": model,
                    "towers": num_devices,
                    "config": label,
                    "optimizer": optimizer,
                    "batch": size,
                    "trace_s": trace,
                    "step_ms": seconds * 1e3,
                    "loss": loss,
                    "all_reduces": _all_reduces(label, model, bucket_bytes),
                    "state_kb": _state_kb(label, model, devices, optimizer),
                    "devices": devices,
                    "tf32": tf.config.experimental.tensor_float_32_execution_enabled(),
                }
            )
    return rows


def bench_devices(num_devices: int, gpu_split_mb: int = 0) -> list[str]:
    """`num_devices` devices: the GPUs, or that many simulated on the CPU (a fresh process).

    With `gpu_split_mb`, the first GPU is split into `num_devices` logical GPUs of that many
    MiB each (several towers on one GPU). Calling it again with the same count lists the
    same devices.
    """
    if not tf.config.list_physical_devices("GPU"):
        towers.simulate_devices(num_devices)
    elif gpu_split_mb:
        towers.simulate_devices(num_devices, "GPU", memory_limit_mb=gpu_split_mb)
    return towers.list_devices(num=num_devices)


def runnable(algorithms: list[str], devices: list[str]) -> list[str]:
    """`algorithms` without `nccl` where it would be refused; says so on stderr."""
    refusal = ops.NcclAllReduce.refusal(devices) if len(devices) > 1 else None
    if "nccl" in algorithms and refusal is not None:
        print(f"bench: no 'nccl' rows on {len(devices)} devices: {refusal}", file=sys.stderr)
        return [a for a in algorithms if a != "nccl"]
    return algorithms


def mirrored_strategy(devices: list[str]) -> tf.distribute.MirroredStrategy:
    """MirroredStrategy on `devices` with its default all-reduce where that can run.

    Its default on GPUs is NCCL, which cannot run on logical GPUs of one GPU; there it
    reduces to one device, as `tf.distribute` does on CPUs.
    """
    on_gpus = all(tf.DeviceSpec.from_string(d).device_type == "GPU" for d in devices)
    if on_gpus and ops.NcclAllReduce.refusal(devices) is not None:
        one = tf.distribute.ReductionToOneDevice()
        return tf.distribute.MirroredStrategy(devices, cross_device_ops=one)
    return tf.distribute.MirroredStrategy(devices)


def time_interleaved(
    steps_by_label: dict[str, Callable],
    data,
    steps: int,
    warmup: int,
    record: dict[str, list[float]] | None = None,
) -> dict[str, tuple[float, float, float]]:
    """`time_step` for several steps at once, their timed steps interleaved.

    Each step is first called (its trace time) and warmed up in turn. Then each of `steps`
    rounds times one call of every step, in an order shuffled anew each round (seeded), so
    a shared machine's slow spells, and whatever one configuration leaves behind for the
    next (caches, allocator), fall on every configuration alike. Every step runs
    `1 + warmup + steps` times. `record`, where given, gets each label's timed steps in
    seconds, in the order they ran (a median hides a row that is slow one step in three).

    Returns:
      Label -> (first-call seconds, median step seconds, the last step's loss).
    """
    labels = list(steps_by_label)
    first, losses = {}, {}
    for label in labels:
        began = time.perf_counter()
        losses[label] = float(steps_by_label[label](data))
        first[label] = time.perf_counter() - began
        for _ in range(warmup):
            losses[label] = float(steps_by_label[label](data))
    times: dict[str, list[float]] = {label: [] for label in labels}
    if record is not None:
        record.update(times)  # (the same lists: filled as the steps run)
    order, shuffle = list(labels), random.Random(0).shuffle
    for _ in range(steps):
        shuffle(order)
        for label in order:
            began = time.perf_counter()
            losses[label] = float(steps_by_label[label](data))
            times[label].append(time.perf_counter() - began)
    return {
        label: (first[label], statistics.median(times[label]), losses[label]) for label in labels
    }


def time_step(step, data, steps: int, warmup: int) -> tuple[float, float, float]:
    """(first-call seconds, median step seconds, the last step's loss)."""
    began = time.perf_counter()
    loss = float(step(data))
    trace = time.perf_counter() - began
    for _ in range(warmup):
        loss = float(step(data))
    times = []
    for _ in range(steps):
        began = time.perf_counter()
        loss = float(step(data))
        times.append(time.perf_counter() - began)
    return trace, statistics.median(times), loss


def _state_kb(label: str, model: str, devices: list[str], optimizer: str) -> float | None:
    """The largest device's optimizer state, in KiB, of a replicated configuration."""
    if "replicated" not in label or "(v1 session)" in label:
        return None
    replicas = towers.Replicated(
        MODELS[model], devices, shard_optimizer_state=label.endswith("sharded")
    )
    state = towers_optimizer(optimizer)
    state.build(replicas.state_copies())
    return max(slot_bytes(state).values(), default=0) / 1024


def slot_bytes(optimizer: towers.Optimizer) -> dict[str, int]:
    """The bytes of the optimizer's slot variables on each device, by device name."""
    per_device: dict[str, int] = {}
    for var in optimizer.slot_variables:
        size = var.shape.num_elements() * var.dtype.size
        per_device[var.device] = per_device.get(var.device, 0) + size
    return per_device


def _all_reduces(label: str, model: str, bucket_bytes: int | None) -> int | None:
    """All-reduces per device and step of a replicated configuration (its buckets)."""
    if "replicated" not in label:
        return None
    variables = MODELS[model]().trainable_variables
    if bucket_bytes is None:
        return len(variables)
    return len(ops.pack_spec([tf.convert_to_tensor(v) for v in variables], bucket_bytes).buckets)
