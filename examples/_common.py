"""What the examples share: the devices to train on, and deterministic initial values."""

import numpy as np
import tensorflow as tf

import towers


def choose_devices(num_towers: int, gpu_split_mb: int = 0) -> list[str]:
    """Every device (or the first `num_towers`), simulating 4 (or more) CPUs without a GPU.

    A process whose CPU is already split into enough logical devices is left as it is. With
    `gpu_split_mb`, the first GPU is split into `num_towers` logical GPUs of that many MiB
    (several towers on one GPU). Under `python -m towers.launch` (a `TF_CONFIG` set), the
    worker joins its cluster first, and the devices are this worker's.

    Raises:
      ValueError: if `gpu_split_mb` is given without `num_towers`.
    """
    if gpu_split_mb and tf.config.list_physical_devices("GPU"):
        if num_towers < 1:
            raise ValueError("--gpu_split_mb needs --towers: how many logical GPUs to make.")
        towers.simulate_devices(num_towers, "GPU", memory_limit_mb=gpu_split_mb)
    elif not tf.config.list_physical_devices("GPU"):
        wanted = max(num_towers, 4)
        cpu = tf.config.list_physical_devices("CPU")[0]
        if len(tf.config.get_logical_device_configuration(cpu) or []) < wanted:
            towers.simulate_devices(wanted)
    towers.init_workers()  # joins the cluster of TF_CONFIG (towers.launch); alone: nothing
    return towers.list_devices(num=num_towers or None)


def glorot(shape: list[int], seed: int, index: int) -> tf.Tensor:
    """Glorot-uniform values for a dense or convolution kernel, deterministic in (seed, index)."""
    receptive = int(np.prod(shape[:-2]))
    limit = np.sqrt(6.0 / (receptive * (shape[-2] + shape[-1])))
    return tf.random.stateless_uniform(shape, [seed, index], -limit, limit)
