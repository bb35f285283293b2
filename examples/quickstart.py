"""Trains a small convolutional net on every available device with `towers`.

On a machine without GPUs, one CPU is split into 4 logical devices (or --towers of them), so
the same code path as on a multi-GPU machine runs anywhere:

    python examples/quickstart.py --steps=200
    python examples/quickstart.py --towers=4 --compare_one_device
    python examples/quickstart.py --replicated
    python examples/quickstart.py --compute_dtype=bfloat16
    python examples/quickstart.py --checkpoint_dir=/tmp/run --steps=100
    python examples/quickstart.py --checkpoint_dir=/tmp/run --steps=200 --resume --towers=2
    python examples/quickstart.py --logdir=/tmp/logs   # then: tensorboard --logdir=/tmp/logs
    python -m towers.launch --workers=2 examples/quickstart.py --replicated --towers=2

The input is a shuffled `tf.data` pipeline whose position is checkpoint state, so a resumed
run reads exactly the batches an uninterrupted one would.
"""

import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow loads: no INFO noise

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import app, flags, logging  # noqa: E402

import towers  # noqa: E402

try:
    from examples._common import choose_devices, glorot
except ImportError:  # run as a script: examples/ itself is on sys.path
    from _common import choose_devices, glorot

_TOWERS = flags.DEFINE_integer("towers", 0, "Towers to build; 0 for every available device.")
_BATCH = flags.DEFINE_integer("batch_size", 256, "Global batch size, split over the towers.")
_STEPS = flags.DEFINE_integer("steps", 100, "Training steps.")
_LR = flags.DEFINE_float("learning_rate", 0.1, "SGD learning rate.")
_LOG_EVERY = flags.DEFINE_integer("log_every", 20, "Log the loss every this many steps.")
_CHECKPOINT_DIR = flags.DEFINE_string(
    "checkpoint_dir", None, "Save checkpoints and the best weights (lowest loss) here."
)
_SAVE_EVERY = flags.DEFINE_integer("save_every", 50, "Checkpoint every this many steps.")
_RESUME = flags.DEFINE_bool("resume", False, "Continue from the latest checkpoint.")
_LOGDIR = flags.DEFINE_string("logdir", None, "Write TensorBoard summaries (loss, speed) here.")
_REPLICATED = flags.DEFINE_bool(
    "replicated", False, "One copy of the model per device, gradients all-reduced."
)
_COMPUTE = flags.DEFINE_enum(
    "compute_dtype",
    "float32",
    ["float32", "bfloat16", "float16"],
    "Compute in this dtype over float32 master weights (float16 with a dynamic loss scale).",
)
_COMPARE = flags.DEFINE_bool(
    "compare_one_device",
    False,
    "Also train on one device at the same global batch; log the step-time ratio and how far "
    "the two models' weights are apart.",
)
_GPU_SPLIT = flags.DEFINE_integer(
    "gpu_split_mb", 0, "Split the first GPU into --towers logical GPUs of this many MiB."
)
_TF32 = flags.DEFINE_bool(
    "tf32",
    True,
    "TensorFloat-32 in float32 matmuls and convolutions on GPUs (TensorFlow's default; it "
    "rounds their inputs to 10 bits: --notf32 computes them in float32).",
)

IMAGE, CLASSES = 16, 10


class ConvNet(tf.Module):
    """conv3x3(16) - relu - maxpool - conv3x3(32) - relu - global mean - dense(10).

    Mixed precision, the recipe: the variables stay float32 (the master weights the optimizer
    updates); `__call__` casts them and the images to `compute_dtype` (bfloat16 or float16)
    and the logits back to float32, so the loss and the gradients that reach the variables
    are float32. float16 also needs a loss scale (`train_step(loss_scale=...)`).
    """

    def __init__(self, seed: int = 0, compute_dtype: tf.DType = tf.float32):
        super().__init__(name="convnet")
        self.compute_dtype = tf.as_dtype(compute_dtype)
        self.conv1 = tf.Variable(glorot([3, 3, 1, 16], seed, 1), name="conv1")
        self.conv2 = tf.Variable(glorot([3, 3, 16, 32], seed, 2), name="conv2")
        self.dense = tf.Variable(glorot([32, CLASSES], seed, 3), name="dense")
        self.bias = tf.Variable(tf.zeros([CLASSES]), name="bias")

    def __call__(self, images: tf.Tensor) -> tf.Tensor:
        """Float32 logits for a batch of [batch, 16, 16, 1] images."""
        dtype = self.compute_dtype
        conv1, conv2, dense, bias = (
            tf.cast(v, dtype) for v in (self.conv1, self.conv2, self.dense, self.bias)
        )
        x = tf.nn.relu(tf.nn.conv2d(tf.cast(images, dtype), conv1, strides=1, padding="SAME"))
        x = tf.nn.max_pool2d(x, ksize=2, strides=2, padding="SAME")
        x = tf.nn.relu(tf.nn.conv2d(x, conv2, strides=1, padding="SAME"))
        return tf.cast(tf.matmul(tf.reduce_mean(x, axis=[1, 2]), dense) + bias, tf.float32)


def make_data(num_examples: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Synthetic images: each class a tiled 4x4 texture of its own, under Gaussian noise.

    The textures (the task) are fixed; `seed` draws the examples.
    """
    textures = np.random.default_rng(1234).normal(size=(CLASSES, 4, 4))
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, CLASSES, size=num_examples).astype(np.int32)
    clean = np.tile(textures[labels], (1, IMAGE // 4, IMAGE // 4))
    images = clean + rng.normal(scale=1.0, size=clean.shape)
    return images[..., None].astype(np.float32), labels


def make_dataset(
    images: np.ndarray, labels: np.ndarray, batch_size: int, seed: int = 0
) -> tf.data.Dataset:
    """Endless batches of `batch_size`, reshuffled every epoch (deterministic in `seed`)."""
    return (
        tf.data.Dataset.from_tensor_slices((images, labels))
        .shuffle(len(images), seed=seed, reshuffle_each_iteration=True)
        .repeat()
        .batch(batch_size, drop_remainder=True)
    )


def train(
    devices: list[str],
    batch_size: int,
    steps: int,
    learning_rate: float,
    seed: int = 0,
    log_every: int = 0,
    checkpoint_dir: str | None = None,
    save_every: int = 0,
    resume: bool = False,
    replicated: bool = False,
    compute_dtype: str = "float32",
    logdir: str | None = None,
) -> dict:
    """Trains a `ConvNet` with `towers.train_step` on `devices`.

    The variables live on the CPU (parameter server), or with `replicated` one copy per
    device (`towers.Replicated`, gradients all-reduced).

    With `checkpoint_dir`, saves a checkpoint every `save_every` steps and at the end, keeps
    the best weights by mean training loss since the last save, and with `resume` continues
    from the latest checkpoint (with any number of devices): weights, optimizer state and the
    input pipeline's position, so the run continues exactly. With `logdir`, writes the loss
    and the speed as TensorBoard scalars.

    Returns:
      A dict with the `losses` and `step_seconds` of the steps run here (the first, the
      trace, excluded from the seconds), the trained `model` and its (closed) checkpoint
      `manager`.

    Raises:
      ValueError: if `checkpoint_dir` already has checkpoints and `resume` is False.
    """
    # float16 needs a loss scale; bfloat16 has float32's range and does not.
    loss_scale = towers.DynamicLossScale() if compute_dtype == "float16" else None
    images, labels = make_data(batch_size * 8, seed)
    workers = towers.current_workers()  # each worker reads its own part of the data
    images, labels = (
        images[workers.index :: workers.num_workers],
        labels[workers.index :: workers.num_workers],
    )
    batches = iter(make_dataset(images, labels, batch_size, seed))
    optimizer = towers.SGD(learning_rate)
    if replicated:
        variables = towers.Replicated(lambda: ConvNet(seed, compute_dtype), devices)
        local_model = variables.local  # each tower's own copy
    else:
        variables = ConvNet(seed, compute_dtype)
        local_model = lambda: variables  # noqa: E731  (one copy, shared by the towers)
    manager, start = None, 0
    if checkpoint_dir:
        extra = {"input": batches}  # the input position: resumes read the next batches
        if loss_scale is not None:
            extra["loss_scale"] = loss_scale
        manager = towers.CheckpointManager(
            checkpoint_dir,
            variables,
            optimizer,
            every_n_steps=save_every or None,
            monitor="min",
            extra=extra,
        )
        if manager.steps and not resume:
            manager.close()
            raise ValueError(
                f"{checkpoint_dir!r} already holds checkpoints (steps {manager.steps}); pass "
                "--resume to continue that run or choose another --checkpoint_dir."
            )
        start = manager.restore_latest()

    def loss_fn(shard):
        shard_images, shard_labels = shard
        logits = local_model()(shard_images)
        return tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=shard_labels, logits=logits)
        )

    writer = tf.summary.create_file_writer(logdir) if logdir else tf.summary.create_noop_writer()
    step_count = tf.Variable(start, dtype=tf.int64, trainable=False)

    @tf.function
    def step(batch):
        loss, _ = towers.train_step(
            loss_fn, variables, optimizer, batch, devices, loss_scale=loss_scale
        )
        towers.summary_scalar("train/loss", loss, step=step_count)  # once, no tower prefix
        return loss

    timer = towers.StepTimer(steps, batch_size, every=log_every or steps, log=logging.info)
    losses, seconds = [], []
    for i in range(start, steps):
        step_count.assign(i + 1)
        began = time.perf_counter()
        with writer.as_default(step=step_count):
            losses.append(float(step(next(batches))))
            seconds.append(time.perf_counter() - began)
            if timer.step_end(i + 1):
                logging.info("step %d  mean loss %.4f", i + 1, statistics.mean(losses[-log_every:]))
        if manager:
            manager.step_end(i + 1, value=statistics.mean(losses[-(save_every or 1) :]))
    if manager and losses and manager.steps[-1:] != [steps]:
        manager.save(steps, value=statistics.mean(losses[-(save_every or 1) :]))
    writer.close()
    if manager:
        manager.close()  # another program may now write to the directory
    model = variables.replicas[0] if replicated else variables
    return {"losses": losses, "step_seconds": seconds[1:], "model": model, "manager": manager}


def main(argv: list[str]) -> None:
    """Trains on every device (simulated when there is no GPU) and logs the speed."""
    del argv
    tf.config.experimental.enable_tensor_float_32_execution(_TF32.value)
    devices = choose_devices(_TOWERS.value, _GPU_SPLIT.value)
    logging.info("training on %d towers: %s", len(devices), devices)
    result = train(
        devices,
        _BATCH.value,
        _STEPS.value,
        _LR.value,
        log_every=_LOG_EVERY.value,
        checkpoint_dir=_CHECKPOINT_DIR.value,
        save_every=_SAVE_EVERY.value,
        resume=_RESUME.value,
        replicated=_REPLICATED.value,
        compute_dtype=_COMPUTE.value,
        logdir=_LOGDIR.value,
    )
    if result["manager"]:
        logging.info("best weights: %s", result["manager"].best_weights)
    towers.barrier("trained")  # several workers: none leaves while a peer still needs it
    if len(result["step_seconds"]) < 2:
        return
    median = statistics.median(result["step_seconds"])
    logging.info(
        "loss %.4f -> %.4f (mean of the last 10); median step %.2f ms, %.0f examples/s",
        result["losses"][0],
        statistics.mean(result["losses"][-10:]),
        median * 1e3,
        _BATCH.value / median,
    )
    if _COMPARE.value:
        single = train(
            devices[:1], _BATCH.value, _STEPS.value, _LR.value, replicated=_REPLICATED.value
        )
        single_median = statistics.median(single["step_seconds"])
        logging.info(
            "one device: median step %.2f ms; %d towers / one device = %.2f",
            single_median * 1e3,
            len(devices),
            median / single_median,
        )
        logging.info(
            "weights after %d steps, %d towers against one device: %.1e apart (the largest "
            "relative difference of a variable; TensorFloat-32 %s)",
            _STEPS.value,
            len(devices),
            weights_apart(result["model"], single["model"]),
            "on" if tf.config.experimental.tensor_float_32_execution_enabled() else "off",
        )


def weights_apart(model: tf.Module, other: tf.Module) -> float:
    """Max over variables of max|a - b| / max|b|: how far two trainings of a model ended."""
    return max(
        float(np.max(np.abs(a.numpy() - b.numpy())) / max(np.max(np.abs(b.numpy())), 1e-30))
        for a, b in zip(model.trainable_variables, other.trainable_variables)
    )


if __name__ == "__main__":
    app.run(main)
