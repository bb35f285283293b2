"""Porting Mask R-CNN's `ParallelModel`: a two-headed model with named outputs on every device.

`ParallelModel` wrapped a Keras model, sliced every input per GPU and merged the outputs by
name, guessing from their shapes whether to concatenate or average. Here a plain `tf.Module`
with a class head and a box head returns a dict of outputs and losses from each tower, and
`towers.train_step` merges them by name with modes you state: per-example outputs
concatenated, per-tower losses averaged weighted by shard size. The weights are then loaded
into a fresh single-device model, whose predictions equal the merged multi-tower outputs:

    python examples/port_mask_rcnn.py --towers=4 --steps=100
    python examples/port_mask_rcnn.py --batch_size=30 --weights=/tmp/detector.h5
"""

import functools
import os
import tempfile
import types

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow loads: no INFO noise

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import app, flags, logging  # noqa: E402

import towers  # noqa: E402

try:
    from examples._common import choose_devices, glorot
except ImportError:  # run as a script: examples/ itself is on sys.path
    from _common import choose_devices, glorot

FEATURES, HIDDEN, CLASSES = 16, 32, 4
BOX_LOSS_WEIGHT = 1.0

# How each named output is merged across towers. Nothing is guessed from shapes: per-example
# outputs are concatenated in batch order; each tower's mean losses are averaged, weighted by
# its shard size, which gives the mean over the whole batch also for uneven splits.
MERGE = {
    "class_logits": "concat",
    "box_deltas": "concat",
    "class_loss": "mean",
    "box_loss": "mean",
}


class Detector(tf.Module):
    """A shared hidden layer, then a class head and a box-regression head.

    Stands in for the heads of a detector: each example is one region's feature vector; the
    class head scores `CLASSES` classes (0 is background), the box head predicts 4 deltas.
    """

    def __init__(self, seed: int = 0):
        super().__init__(name="detector")
        self.hidden_w = tf.Variable(glorot([FEATURES, HIDDEN], seed, 1), name="hidden_w")
        self.hidden_b = tf.Variable(tf.zeros([HIDDEN]), name="hidden_b")
        self.class_w = tf.Variable(glorot([HIDDEN, CLASSES], seed, 2), name="class_w")
        self.class_b = tf.Variable(tf.zeros([CLASSES]), name="class_b")
        self.box_w = tf.Variable(glorot([HIDDEN, 4], seed, 3), name="box_w")
        self.box_b = tf.Variable(tf.zeros([4]), name="box_b")

    def __call__(self, features: tf.Tensor) -> dict[str, tf.Tensor]:
        """Class logits [batch, CLASSES] and box deltas [batch, 4] for [batch, FEATURES]."""
        hidden = tf.nn.relu(tf.matmul(features, self.hidden_w) + self.hidden_b)
        return {
            "class_logits": tf.matmul(hidden, self.class_w) + self.class_b,
            "box_deltas": tf.matmul(hidden, self.box_w) + self.box_b,
        }


def make_data(num_examples: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Synthetic regions: features, a class label (0 = background) and 4 box targets.

    The task (class centres and the linear box map) is fixed; `seed` draws the examples.
    """
    task = np.random.default_rng(1234)
    centres = task.normal(scale=1.5, size=(CLASSES, FEATURES))
    box_map = task.normal(scale=0.1, size=(FEATURES, 4))
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, CLASSES, size=num_examples)
    features = centres[labels] + rng.normal(size=(num_examples, FEATURES))
    boxes = features @ box_map + rng.normal(scale=0.05, size=(num_examples, 4))
    return {
        "features": features.astype(np.float32),
        "labels": labels.astype(np.int32),
        "boxes": boxes.astype(np.float32),
    }


def batch_at(data: dict[str, np.ndarray], step: int, batch_size: int) -> dict[str, tf.Tensor]:
    """The batch of step `step` (0-based): consecutive examples, wrapping around the data."""
    first = step * batch_size % len(data["labels"])
    return {k: tf.constant(v[first : first + batch_size]) for k, v in data.items()}


def loss_and_outputs(model: Detector, batch: dict) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
    """The total loss and the named outputs and losses of `model` on `batch` (or a shard).

    Every loss is a mean over the examples it is given, which is what makes the size-weighted
    average over towers equal to the whole-batch value. The box loss counts only foreground
    regions but still divides by the number of examples, not by the number of foreground ones
    (a per-shard count of positives would weight the towers differently).

    Returns:
      `(total_loss, outputs)`, outputs holding "class_logits", "box_deltas", "class_loss"
      and "box_loss".
    """
    heads = model(batch["features"])
    class_loss = tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=batch["labels"], logits=heads["class_logits"]
        )
    )
    foreground = tf.cast(batch["labels"] > 0, tf.float32)
    smooth_l1 = _smooth_l1(batch["boxes"] - heads["box_deltas"])
    box_loss = tf.reduce_mean(foreground * smooth_l1)
    total = class_loss + BOX_LOSS_WEIGHT * box_loss
    return total, {**heads, "class_loss": class_loss, "box_loss": box_loss}


def _smooth_l1(diff: tf.Tensor) -> tf.Tensor:
    """Smooth L1 (Huber, delta 1) summed over the 4 box coordinates."""
    absolute = tf.abs(diff)
    return tf.reduce_sum(tf.where(absolute < 1.0, 0.5 * diff**2, absolute - 0.5), axis=-1)


def make_train_step(model: Detector, optimizer: towers.Optimizer, devices: list[str]):
    """A `tf.function` running one step on `devices`: `step(batch) -> (loss, outputs)`.

    The outputs are the merged dict of `loss_and_outputs`, computed with the weights the step
    starts from (before its update).
    """

    def tower_fn(shard):
        return loss_and_outputs(model, shard)

    @tf.function
    def step(batch):
        return towers.train_step(tower_fn, model, optimizer, batch, devices, merge=MERGE)

    return step


def predict_on_towers(model: Detector, features: tf.Tensor, devices: list[str]) -> dict:
    """Inference on every device, stage by stage: split, one tower each, merge by name."""
    shards = towers.ops.split_batch(features, len(devices))
    per_tower = towers.replicate(model, shards, devices)
    return towers.ops.merge_outputs(per_tower, {"class_logits": "concat", "box_deltas": "concat"})


def train(
    devices: list[str],
    batch_size: int,
    steps: int,
    learning_rate: float,
    seed: int = 0,
    log_every: int = 0,
) -> dict:
    """Trains a `Detector` on `devices` with `towers.train_step`, outputs merged by name.

    Returns:
      A dict with the total `losses` and the per-head `class_losses` and `box_losses` of each
      step, the trained `model`, its `step` function (to run more steps) and the `data`.
    """
    data = make_data(batch_size * 8, seed)
    model = Detector(seed)  # variables created here, on the parameter server's device (CPU)
    step = make_train_step(model, towers.SGD(learning_rate), devices)
    history = {"losses": [], "class_losses": [], "box_losses": []}
    for i in range(steps):
        loss, outputs = step(batch_at(data, i, batch_size))
        history["losses"].append(float(loss))
        history["class_losses"].append(float(outputs["class_loss"]))
        history["box_losses"].append(float(outputs["box_loss"]))
        if log_every and (i + 1) % log_every == 0:
            logging.info(
                "step %d  loss %.4f  (class %.4f, box %.4f)",
                i + 1,
                history["losses"][-1],
                history["class_losses"][-1],
                history["box_losses"][-1],
            )
    return {**history, "model": model, "step": step, "data": data}


def load_single_device(path: str, device: str = "/cpu:0") -> Detector:
    """A fresh `Detector` on one device with the weights saved at `path`."""
    with tf.device(device):
        model = Detector(seed=12345)  # its own initial values, all replaced
    towers.restore_weights(model, path)
    return model


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
            "batch_size", 62, "Global batch size (need not divide evenly)."
        ),
        steps=flags.DEFINE_integer("steps", 60, "Training steps."),
        learning_rate=flags.DEFINE_float("learning_rate", 0.1, "SGD learning rate."),
        log_every=flags.DEFINE_integer("log_every", 20, "Log the losses every this many steps."),
        weights=flags.DEFINE_string("weights", None, "Where to save the weights (.npz, .h5, dir)."),
    )


def main(argv: list[str], options: types.SimpleNamespace) -> None:
    """Trains on several towers, saves, reloads on one device and compares the outputs."""
    del argv
    devices = choose_devices(options.towers.value)
    logging.info("training on %d towers: %s", len(devices), devices)
    result = train(
        devices,
        options.batch_size.value,
        options.steps.value,
        options.learning_rate.value,
        log_every=options.log_every.value,
    )
    path = options.weights.value or os.path.join(tempfile.mkdtemp(), "detector.npz")
    towers.save_weights(result["model"], path)
    logging.info("saved %s: %s", path, sorted(towers.named_variables(result["model"])))

    # One more multi-tower step: its outputs come from the weights just saved.
    batch = batch_at(result["data"], options.steps.value, options.batch_size.value)
    _, merged = result["step"](batch)
    single = load_single_device(path)
    _, expected = loss_and_outputs(single, batch)
    for name in MERGE:
        logging.info(
            "%s: towers vs one device, max abs difference %.2e",
            name,
            float(tf.reduce_max(tf.abs(merged[name] - expected[name]))),
        )
    predicted = predict_on_towers(single, batch["features"], devices)
    logging.info(
        "inference on %d towers vs one device, class logits max abs difference %.2e",
        len(devices),
        float(tf.reduce_max(tf.abs(predicted["class_logits"] - expected["class_logits"]))),
    )


if __name__ == "__main__":
    app.run(functools.partial(main, options=define_flags()))
