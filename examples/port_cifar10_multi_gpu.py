"""Porting TF1's `cifar10_multi_gpu_train` recipe: a v1 Graph and Session, towers by `towers`.

The recipe kept its shape: placeholders fed from numpy, a `global_step` variable incremented
by every step, one tower per device, the tower gradients averaged and applied, the loss fetched
with `sess.run`, and checkpoints every N steps. What `towers` takes over is the tower loop, the
exact (size-weighted) gradient average and the placement of the variables:

    python examples/port_cifar10_multi_gpu.py --towers=4 --steps=100
    python examples/port_cifar10_multi_gpu.py --stages   # the stages spelled out, same result
    python examples/port_cifar10_multi_gpu.py --checkpoint_dir=/tmp/cifar --steps=40
    python examples/port_cifar10_multi_gpu.py --checkpoint_dir=/tmp/cifar --steps=80  # resumes

Checkpoints: `towers.CheckpointManager(..., session=sess)` reads and assigns the variables
of the v1 graph through the session; the global step is kept with them (`extra=`), and every
checkpoint's weights file has canonical (tower-free) names that any single-device program
loads with `towers.restore_weights`.
"""

import dataclasses
import functools
import os
import types

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow loads: no INFO noise

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import app, flags, logging  # noqa: E402

import towers  # noqa: E402
from towers import ops  # noqa: E402

try:
    from examples._common import choose_devices, glorot
except ImportError:  # run as a script: examples/ itself is on sys.path
    from _common import choose_devices, glorot

IMAGE, CHANNELS, CLASSES = 32, 3, 10


class ConvNet(tf.Module):
    """conv5x5(16) - relu - maxpool - conv3x3(32) - relu - maxpool - global mean - dense(10)."""

    def __init__(self, seed: int = 0, dtype: tf.DType = tf.float32):
        super().__init__(name="convnet")

        def init(shape, i):
            return tf.cast(glorot(shape, seed, i), dtype)

        self.conv1 = tf.Variable(init([5, 5, CHANNELS, 16], 1), name="conv1")
        self.conv2 = tf.Variable(init([3, 3, 16, 32], 2), name="conv2")
        self.dense = tf.Variable(init([32, CLASSES], 3), name="dense")
        self.bias = tf.Variable(tf.zeros([CLASSES], dtype), name="bias")

    def __call__(self, images: tf.Tensor) -> tf.Tensor:
        """Logits [batch, CLASSES] for images [batch, 32, 32, 3]."""
        x = tf.nn.relu(tf.nn.conv2d(images, self.conv1, strides=1, padding="SAME"))
        x = tf.nn.max_pool2d(x, ksize=2, strides=2, padding="SAME")
        x = tf.nn.relu(tf.nn.conv2d(x, self.conv2, strides=1, padding="SAME"))
        x = tf.nn.max_pool2d(x, ksize=2, strides=2, padding="SAME")
        return tf.matmul(tf.reduce_mean(x, axis=[1, 2]), self.dense) + self.bias


def make_data(num_examples: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Synthetic 32x32x3 images: each class a tiled 4x4x3 texture of its own, plus noise."""
    textures = np.random.default_rng(1234).normal(size=(CLASSES, 4, 4, CHANNELS))
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, CLASSES, size=num_examples).astype(np.int32)
    clean = np.tile(textures[labels], (1, IMAGE // 4, IMAGE // 4, 1))
    images = clean + rng.normal(scale=1.0, size=clean.shape)
    return images.astype(np.float32), labels


def batch_at(images: np.ndarray, labels: np.ndarray, step: int, batch_size: int) -> tuple:
    """The numpy batch of step `step` (0-based): consecutive examples, wrapping around."""
    first = step * batch_size % len(images)
    return images[first : first + batch_size], labels[first : first + batch_size]


def tower_loss(model: ConvNet, shard: tuple[tf.Tensor, tf.Tensor]) -> tf.Tensor:
    """The recipe's `tower_loss`: the mean cross-entropy over this tower's shard.

    In float64 through one-hot labels: a GPU has no float64 kernel for the sparse op.
    """
    images, labels = shard
    logits = model(images)
    if logits.dtype == tf.float64:
        one_hot = tf.one_hot(labels, CLASSES, dtype=tf.float64)
        losses = tf.nn.softmax_cross_entropy_with_logits(labels=one_hot, logits=logits)
    else:
        losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    return tf.reduce_mean(losses)


@dataclasses.dataclass
class TrainGraph:
    """The v1 graph of a multi-tower training step and the handles a session loop needs."""

    graph: tf.Graph
    images: tf.Tensor
    labels: tf.Tensor
    loss: tf.Tensor
    train_op: tf.Tensor
    global_step: tf.Variable
    model: ConvNet
    optimizer: towers.SGD


def build_graph(
    devices: list[str],
    learning_rate: float,
    seed: int = 0,
    stages: bool = False,
    dtype: tf.DType = tf.float32,
) -> TrainGraph:
    """Builds placeholders, the model, one tower per device and the update in a new v1 graph.

    Args:
      devices: One device per tower.
      learning_rate: The SGD step size.
      seed: Initial weights.
      stages: Build the step stage by stage (split, replicate, average, apply) instead of
        with `towers.train_step`; the graph computes the same values.
      dtype: The model's and the images' dtype (float64 to compare runs past float32's
        round-off, which ReLUs and max-pools can amplify).

    Returns:
      A `TrainGraph`. Running `train_op` runs one step and returns the new global step.
    """
    graph = tf.Graph()
    with graph.as_default():
        global_step = tf.compat.v1.train.get_or_create_global_step()
        images = tf.compat.v1.placeholder(dtype, [None, IMAGE, IMAGE, CHANNELS], "images")
        labels = tf.compat.v1.placeholder(tf.int32, [None], "labels")
        model = ConvNet(seed, dtype)  # made outside the towers: the parameter server's CPU
        optimizer = towers.SGD(learning_rate)
        loss_fn = functools.partial(tower_loss, model)
        if stages:
            loss = _step_by_stages(loss_fn, model, optimizer, (images, labels), devices)
        else:
            loss, _ = towers.train_step(loss_fn, model, optimizer, (images, labels), devices)
        # `loss` depends on the update: the step counts only once the weights have changed.
        with tf.control_dependencies([loss]):
            train_op = tf.compat.v1.assign_add(global_step, 1)
    return TrainGraph(graph, images, labels, loss, train_op, global_step, model, optimizer)


def _step_by_stages(loss_fn, model, optimizer, batch, devices) -> tf.Tensor:
    """`towers.train_step`'s stages in the recipe's order; returns the loss after the update."""
    shards = ops.split_batch(batch, len(devices))  # on the CPU; sizes differ by at most 1
    sizes = ops.shard_sizes(batch, len(devices))  # tensors here: the batch size is fed
    tower_fn = functools.partial(towers.tower_gradients, loss_fn, model)
    per_tower = towers.replicate(tower_fn, shards, devices)  # [(loss, outputs, grads)] * K
    losses, _, tower_grads = (list(column) for column in zip(*per_tower))
    variables = towers.variable_list(model)
    grads = ops.average_gradients(tower_grads, weights=sizes, variables=variables)
    update = optimizer.apply_gradients(list(zip(grads, variables)))
    with tf.control_dependencies([update]):
        return tf.identity(ops.merge_outputs(losses, "mean", weights=sizes, device="/cpu:0"))


def train(
    devices: list[str],
    batch_size: int,
    steps: int,
    learning_rate: float,
    seed: int = 0,
    stages: bool = False,
    checkpoint_dir: str | None = None,
    save_every: int = 0,
    log_every: int = 0,
    dtype: tf.DType = tf.float32,
) -> dict:
    """Trains in a v1 Session until the global step reaches `steps`.

    With `checkpoint_dir`, resumes from its latest checkpoint, saves one every `save_every`
    steps and at the end (the last 3 are kept). `dtype` is the model's (see `build_graph`).

    Returns:
      A dict with the `losses` of the steps run here, the final `global_step`, the `weights`
      (canonical name -> numpy array), the `weights_path` of the last checkpoint (None
      without a directory) and the `kept` checkpoint steps.
    """
    images, labels = make_data(batch_size * 8, seed)
    images = images.astype(tf.as_dtype(dtype).as_numpy_dtype)
    train_graph = build_graph(devices, learning_rate, seed, stages, dtype)
    g = train_graph
    losses, weights_path, kept = [], None, []
    with tf.compat.v1.Session(graph=g.graph, config=towers.session_config()) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        manager = None
        if checkpoint_dir:
            manager = towers.CheckpointManager(
                checkpoint_dir,
                g.model,
                g.optimizer,
                every_n_steps=save_every or None,
                extra={"global_step": {"global_step": g.global_step}},
                session=sess,  # a v1 graph: values are read and assigned in the session
            )
            if manager.restore_latest():
                logging.info("resumed from step %d", int(sess.run(g.global_step)))
        step = int(sess.run(g.global_step))
        while step < steps:
            batch_images, batch_labels = batch_at(images, labels, step, batch_size)
            feed = {g.images: batch_images, g.labels: batch_labels}
            step, loss = sess.run([g.train_op, g.loss], feed)
            losses.append(float(loss))
            if log_every and step % log_every == 0:
                logging.info("step %d  loss %.4f", step, loss)
            if manager:
                manager.step_end(step)
        if manager:
            if manager.steps[-1:] != [step]:
                manager.save(step)
            weights_path, kept = manager.latest_weights, manager.steps
            manager.close()
        named = towers.named_variables(g.model)
        weights = dict(zip(named, sess.run(list(named.values()))))
        global_step = int(sess.run(g.global_step))
    return {
        "losses": losses,
        "global_step": global_step,
        "weights": weights,
        "weights_path": weights_path,
        "kept": kept,
    }


def define_flags() -> types.SimpleNamespace:
    """Defines this program's flags; called only when it runs as a program.

    Examples share flag names (`--towers`, `--steps`...); defined at import, two examples
    imported by one test process would collide (absl's `DuplicateFlagError`).

    Returns:
      The `FlagHolder`s, by name.
    """
    return types.SimpleNamespace(
        towers=flags.DEFINE_integer("towers", 4, "Towers to build; 0 for every available device."),
        batch_size=flags.DEFINE_integer(
            "batch_size", 64, "Global batch size, split over the towers."
        ),
        steps=flags.DEFINE_integer("steps", 60, "Train until the global step reaches this."),
        learning_rate=flags.DEFINE_float("learning_rate", 0.1, "SGD learning rate."),
        log_every=flags.DEFINE_integer("log_every", 10, "Log the loss every this many steps."),
        stages=flags.DEFINE_bool("stages", False, "Split, replicate, average, apply one by one."),
        checkpoint_dir=flags.DEFINE_string(
            "checkpoint_dir", None, "Save (and resume from) checkpoints and the final weights here."
        ),
        save_every=flags.DEFINE_integer("save_every", 20, "Checkpoint every this many steps."),
    )


def main(argv: list[str], options: types.SimpleNamespace) -> None:
    """Trains in a v1 Session on every device (simulated when there is no GPU)."""
    del argv
    devices = choose_devices(options.towers.value)
    logging.info("training on %d towers: %s", len(devices), devices)
    result = train(
        devices,
        options.batch_size.value,
        options.steps.value,
        options.learning_rate.value,
        stages=options.stages.value,
        checkpoint_dir=options.checkpoint_dir.value,
        save_every=options.save_every.value,
        log_every=options.log_every.value,
    )
    if result["losses"]:
        logging.info(
            "global step %d, loss %.4f -> %.4f",
            result["global_step"],
            result["losses"][0],
            result["losses"][-1],
        )
    if result["weights_path"]:
        logging.info("weights for any single-device program: %s", result["weights_path"])


if __name__ == "__main__":
    app.run(functools.partial(main, options=define_flags()))
