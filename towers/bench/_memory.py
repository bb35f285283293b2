"""The memory suite: peak device memory of a step, with and without micro-batches."""

import tensorflow as tf

import towers
from towers.bench._models import mean_loss
from towers.bench._worker import bench_devices

_WIDTH = 1024


class _Wide(tf.Module):
    """784-1024-1024-10: at large batches its activations outweigh its weights (7 MB)."""

    def __init__(self):
        super().__init__(name="wide")
        init = tf.random.stateless_normal
        self.w1 = tf.Variable(init([784, _WIDTH], [0, 1]) * 0.03)
        self.w2 = tf.Variable(init([_WIDTH, _WIDTH], [0, 2]) * 0.02)
        self.w3 = tf.Variable(init([_WIDTH, 10], [0, 3]) * 0.02)

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        """Logits."""
        return tf.nn.relu(tf.nn.relu(x @ self.w1) @ self.w2) @ self.w3


def peak_megabytes(num_devices: int, batch_size: int, micro_batches: list[int]) -> list[tuple]:
    """Rows (micro-batches, peak MB summed over the tower devices, loss) after 3 steps each.

    Must run in a fresh process (it simulates the devices on CPU-only machines).
    """
    devices = bench_devices(num_devices)
    rng = tf.random.Generator.from_seed(0)
    batch = (rng.normal([batch_size, 784]), rng.uniform([batch_size], 0, 10, tf.int32))
    rows = []
    for parts in micro_batches:
        model, optimizer = _Wide(), towers.SGD(0.01)

        @tf.function
        def step(data, model=model, optimizer=optimizer, parts=parts):
            return towers.train_step(
                lambda shard: mean_loss(model, shard),
                model,
                optimizer,
                data,
                devices,
                micro_batches=parts,
            )[0]

        float(step(batch))  # trace and warm up
        for device in devices:
            tf.config.experimental.reset_memory_stats(short_name(device))
        for _ in range(3):
            loss = float(step(batch))
        peak = sum(tf.config.experimental.get_memory_info(short_name(d))["peak"] for d in devices)
        rows.append((parts, peak / 2**20, loss))
    return rows


def short_name(device: str) -> str:
    """The name `tf.config.experimental.get_memory_info` takes, e.g. "GPU:1"."""
    spec = tf.DeviceSpec.from_string(device)
    return f"{spec.device_type}:{spec.device_index}"
