"""Porting `keras.utils.multi_gpu_model`: a Keras-layers convnet on real digits, every device.

The program being ported built a Keras model, wrapped it with `multi_gpu_model(model, gpus=4)`
(removed from TensorFlow), compiled the wrapper with Adam and fitted it, with a
`ParallelModelCheckpoint` callback saving the template model's best weights. Here the same
model is a `tf.Module` made of Keras layers, and the loop is ours:

* Keras layers as building blocks: `towers` finds their variables and names them by the
  model's structure ("conv1/kernel"), so the weights load into a model built anywhere.
* `towers.BatchNorm(sync=True)` replaces `keras.layers.BatchNormalization`: statistics over the
  whole batch, moving averages moved once per step (Keras' layer, in 4 towers, moves them
  about 4 times as far per step, from a quarter of the batch each time).
* `towers.Adam` with a warm-up into a cosine decay; gradients clipped by global norm in the
  gradient hook, where the whole batch's gradient is seen.
* `towers.CheckpointManager(monitor="max")` keeps the best weights by test accuracy (what
  `ParallelModelCheckpoint(save_best_only=True)` was for) and resumes exactly, input position
  included; `towers.evaluate` measures accuracy on every device.

The data are the 8x8 handwritten digits that scikit-learn ships (`pip install
'tf-towers[digits]'`):

    python examples/port_multi_gpu_model.py --towers=4 --steps=300
    python examples/port_multi_gpu_model.py --compare   # 1 and 4 towers: accuracy and time
    python examples/port_multi_gpu_model.py --checkpoint_dir=/tmp/digits --stop_after=150
    python examples/port_multi_gpu_model.py --checkpoint_dir=/tmp/digits --resume
"""

import functools
import os
import time
import types

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow loads: no INFO noise

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import app, flags, logging  # noqa: E402

import towers  # noqa: E402

try:
    from examples._common import choose_devices
except ImportError:  # run as a script: examples/ itself is on sys.path
    from _common import choose_devices

CLASSES = 10


class DigitsNet(tf.Module):
    """conv3x3(16) - BN - relu - maxpool - conv3x3(32) - BN - relu - global mean - dense(10).

    Keras layers for the convolutions and the head, `towers.BatchNorm` for normalization.
    `smooth`: softplus and average pooling in place of relu and max pooling, which have
    kinks: an input within round-off of one falls on either side for another batch split,
    so that only a smooth model trains alike on 1 and 4 towers to float32 round-off.
    """

    def __init__(self, seed: int = 0, sync: bool = True, smooth: bool = False):
        super().__init__(name="digits")
        self.smooth = smooth

        def init(i):
            return keras.initializers.GlorotUniform(seed=seed * 100 + i)

        self.conv1 = keras.layers.Conv2D(16, 3, padding="same", use_bias=False,
                                         kernel_initializer=init(1))  # fmt: skip
        self.bn1 = towers.BatchNorm(momentum=0.9, sync=sync)
        self.conv2 = keras.layers.Conv2D(32, 3, padding="same", use_bias=False,
                                         kernel_initializer=init(2))  # fmt: skip
        self.bn2 = towers.BatchNorm(momentum=0.9, sync=sync)
        self.head = keras.layers.Dense(CLASSES, kernel_initializer=init(3))

    def __call__(self, images: tf.Tensor, training: bool) -> tf.Tensor:
        """Logits for [batch, 8, 8, 1] images."""
        activation = tf.nn.softplus if self.smooth else tf.nn.relu
        pool = tf.nn.avg_pool2d if self.smooth else tf.nn.max_pool2d
        x = activation(self.bn1(self.conv1(images), training=training))
        x = pool(x, ksize=2, strides=2, padding="SAME")
        x = activation(self.bn2(self.conv2(x), training=training))
        return self.head(tf.reduce_mean(x, axis=[1, 2]))


def load_digits(test_fraction: float = 0.2) -> tuple:
    """The scikit-learn digits as ((train images, labels), (test images, labels)), fixed split.

    Raises:
      ImportError: without scikit-learn, naming the extra that brings it.
    """
    try:
        from sklearn.datasets import load_digits as sklearn_digits
    except ImportError:
        raise ImportError(
            "This example reads the digits scikit-learn ships: pip install 'tf-towers[digits]'"
        ) from None
    digits = sklearn_digits()
    images = (digits.images / 16.0).astype(np.float32)[..., None]
    labels = digits.target.astype(np.int32)
    order = np.random.default_rng(0).permutation(len(images))
    test = order[: int(len(order) * test_fraction)]
    train = order[len(test) :]
    return (images[train], labels[train]), (images[test], labels[test])


def train(
    devices: list[str],
    steps: int,
    batch_size: int = 64,
    learning_rate: float = 0.03,
    seed: int = 0,
    eval_every: int = 50,
    clip_norm: float = 1.0,
    checkpoint_dir: str | None = None,
    resume: bool = False,
    stop_after: int | None = None,
    smooth: bool = False,
) -> dict:
    """Trains `DigitsNet` on `devices` for `steps` and evaluates it every `eval_every` steps.

    `stop_after` interrupts the run earlier (the schedule still spans `steps`): with
    `checkpoint_dir`, a later call with `resume` continues it exactly. `smooth`: see
    `DigitsNet`.

    Returns:
      A dict: `model`, the test `accuracy` at the end, the `losses` of the steps run here,
      the `seconds` the training took (the first step, a trace, and evaluation excluded),
      and the `best_weights` path (with `checkpoint_dir`).

    Raises:
      ValueError: if `checkpoint_dir` holds checkpoints and `resume` is False.
    """
    (train_images, train_labels), (test_images, test_labels) = load_digits()
    batches = iter(
        tf.data.Dataset.from_tensor_slices((train_images, train_labels))
        .shuffle(len(train_images), seed=seed)
        .repeat()
        .batch(batch_size, drop_remainder=True)
    )
    test_set = tf.data.Dataset.from_tensor_slices((test_images, test_labels)).batch(100)
    model = DigitsNet(seed, smooth=smooth)
    model(tf.zeros([1, 8, 8, 1]), training=False)  # the variables exist before a restore
    # A ramp from 0: Adam's first step moves every weight by about the rate, whatever its
    # gradient, also where the gradient is round-off (the convolutions' biases before a
    # BatchNorm have none), which would set runs on 1 and 4 towers apart from the start.
    schedule = towers.schedules.LinearWarmup(
        steps // 10, towers.schedules.CosineDecay(learning_rate, steps), initial=0.0
    )
    optimizer = towers.Adam(schedule)
    manager, start = None, 0
    if checkpoint_dir:
        manager = towers.CheckpointManager(
            checkpoint_dir, model, optimizer, monitor="max", extra={"input": batches}
        )
        if manager.steps and not resume:
            manager.close()
            raise ValueError(f"{checkpoint_dir!r} holds checkpoints; pass --resume.")
        start = manager.restore_latest()

    def loss_fn(shard):
        images, labels = shard
        logits = model(images, training=True)
        return tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
        )

    def clip(grads, variables):
        del variables
        return tf.clip_by_global_norm(grads, clip_norm)[0]

    @tf.function
    def step(batch):
        return towers.train_step(loss_fn, model, optimizer, batch, devices, gradient_hook=clip)[0]

    def accuracy_on_test() -> float:
        def fn(shard):
            images, labels = shard
            predicted = tf.argmax(model(images, training=False), axis=1, output_type=tf.int32)
            return {"accuracy": tf.cast(predicted == labels, tf.float32)}

        return towers.evaluate(fn, test_set, devices).metrics["accuracy"]

    losses, seconds, accuracy = [], 0.0, None
    for i in range(start, min(steps, stop_after or steps)):
        began = time.perf_counter()
        losses.append(float(step(next(batches))))
        if i > start:  # the first step traces the function: not counted
            seconds += time.perf_counter() - began
        done = i + 1
        if done % eval_every == 0 or done in (steps, stop_after):
            accuracy = accuracy_on_test()
            logging.info("step %d  loss %.4f  test accuracy %.4f", done, losses[-1], accuracy)
            if manager:
                manager.save(done, value=accuracy)  # keeps the last 3 and the best
    best = manager.best_weights if manager else None
    if manager:
        manager.close()
    if accuracy is None:
        accuracy = accuracy_on_test()
    return {
        "model": model,
        "accuracy": accuracy,
        "losses": losses,
        "seconds": seconds,
        "best_weights": best,
    }


def define_flags() -> types.SimpleNamespace:
    """This program's flags, defined only when it runs (examples share flag names)."""
    return types.SimpleNamespace(
        towers=flags.DEFINE_integer("towers", 0, "Towers; 0 for every available device."),
        steps=flags.DEFINE_integer("steps", 300, "Training steps."),
        batch_size=flags.DEFINE_integer("batch_size", 64, "Global batch size."),
        compare=flags.DEFINE_bool("compare", False, "Train with 1 and 4 towers; compare."),
        checkpoint_dir=flags.DEFINE_string("checkpoint_dir", None, "Checkpoints go here."),
        resume=flags.DEFINE_bool("resume", False, "Continue from the latest checkpoint."),
        stop_after=flags.DEFINE_integer("stop_after", None, "Interrupt after this step."),
    )


def main(argv: list[str], options: types.SimpleNamespace) -> None:
    """Trains on the digits; with --compare, on 1 and on 4 towers, and prints both."""
    del argv
    devices = choose_devices(4 if options.compare.value else options.towers.value)
    runs = [devices[:1], devices[:4]] if options.compare.value else [devices]
    for run in runs:
        result = train(
            run,
            options.steps.value,
            options.batch_size.value,
            checkpoint_dir=None if options.compare.value else options.checkpoint_dir.value,
            resume=options.resume.value,
            stop_after=options.stop_after.value,
        )
        logging.info(
            "%d tower(s): test accuracy %.4f, %.1f s of training",
            len(run),
            result["accuracy"],
            result["seconds"],
        )
        if result["best_weights"]:
            logging.info("best weights: %s", result["best_weights"])


if __name__ == "__main__":
    app.run(functools.partial(main, options=define_flags()))
