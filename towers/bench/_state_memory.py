"""The state suite: optimizer state and device memory per device, sharded or not."""

import statistics
import time

import tensorflow as tf

import towers
from towers.bench._memory import short_name
from towers.bench._steps import towers_optimizer
from towers.bench._tables import format_table
from towers.bench._worker import slot_bytes

LAYERS, WIDTH = 12, 1536  # 12 x 9 MiB kernels: Adam's two slots weigh 216 MiB per copy


class Deep(tf.Module):
    """LAYERS square tanh layers: its weights and state outweigh its activations."""

    def __init__(self, layers: int = LAYERS, width: int = WIDTH):
        super().__init__(name="deep")
        init = tf.random.stateless_normal
        self.kernels = [
            tf.Variable(init([width, width], [1, i]) * (1.0 / width**0.5), name=f"w{i}")
            for i in range(layers)
        ]
        self.biases = [tf.Variable(tf.zeros([width]), name=f"b{i}") for i in range(layers)]

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        """The last layer's activations."""
        for kernel, bias in zip(self.kernels, self.biases):
            x = tf.tanh(x @ kernel + bias)
        return x


def state_row(
    devices: list[str],
    sharded: bool,
    optimizer: str,
    batch_size: int,
    steps: int,
    *,
    layers: int = LAYERS,
    width: int = WIDTH,
) -> dict:
    """One configuration's row: state and memory of its devices after `steps` steps.

    Device memory is TensorFlow's allocator's (`get_memory_info`): GPUs only (None on CPUs);
    run one configuration per process for it to be the configuration's alone.
    """
    num_devices = len(devices)
    replicas = towers.Replicated(
        lambda: Deep(layers, width), devices, shard_optimizer_state=sharded
    )
    rule = towers_optimizer(optimizer)
    rng = tf.random.Generator.from_seed(0)
    batch = (rng.normal([batch_size, width]), rng.normal([batch_size, width]))

    @tf.function
    def step(data):
        def loss_fn(shard):
            x, y = shard
            return tf.reduce_mean(tf.square(replicas.local()(x) - y))

        return towers.train_step(loss_fn, replicas, rule, data, devices)[0]

    float(step(batch))  # trace, build the state
    for device in devices:
        _reset(device)
    times = []
    for _ in range(steps):
        began = time.perf_counter()
        loss = float(step(batch))
        times.append(time.perf_counter() - began)
    state = slot_bytes(rule)
    firsts = [replicas.variables_of(i)[0] for i in range(num_devices)]
    per_device = [state.get(first.device, 0) for first in firsts]
    memory = [_memory(d) for d in devices]
    mib = 2**20
    weights = sum(v.shape.num_elements() * v.dtype.size for v in replicas.variables_of(0))
    return {
        "towers": num_devices,
        "sharded": sharded,
        "weights_mib": weights / mib,
        "state_mib": [b / mib for b in per_device],
        "current_mib": [m[0] / mib for m in memory] if memory[0] else None,
        "peak_mib": [m[1] / mib for m in memory] if memory[0] else None,
        "ms": statistics.median(times) * 1e3,
        "loss": loss,
    }


def state_table(rows: list[dict], optimizer: str) -> str:
    """The state suite's table, unsharded and sharded side by side per device count."""
    header = [
        "towers",
        "state",
        "weights MiB/copy",
        "state MiB (largest device)",
        "state MiB (smallest)",
        "device MiB now (largest)",
        "device MiB peak (largest)",
        "ms/step",
    ]
    lines = []
    for row in rows:
        current, peak = row["current_mib"], row["peak_mib"]
        lines.append(
            (
                row["towers"],
                "sharded" if row["sharded"] else "whole",
                row["weights_mib"],
                max(row["state_mib"]),
                min(row["state_mib"]),
                max(current) if current else "-",
                max(peak) if peak else "-",
                row["ms"],
            )
        )
    title = f"state: {LAYERS} layers of {WIDTH}x{WIDTH} (+bias), {optimizer}, Replicated"
    note = (
        "state MiB: the optimizer's slot variables on each device; device MiB: TensorFlow's "
        "allocator on each (GPUs only), after the steps; peak over the timed steps."
    )
    return f"{title}\n{format_table(header, lines)}\n{note}"


def _reset(device: str) -> None:
    if tf.DeviceSpec.from_string(device).device_type == "GPU":
        tf.config.experimental.reset_memory_stats(short_name(device))


def _memory(device: str) -> tuple[int, int] | None:
    if tf.DeviceSpec.from_string(device).device_type != "GPU":
        return None
    info = tf.config.experimental.get_memory_info(short_name(device))
    return info["current"], info["peak"]
