"""Loads weights trained on several towers into a plain single-device model for inference.

The weights file has canonical names (attribute paths such as "conv1"), no tower prefix, so
the program that reads it needs nothing of `towers` but `restore_weights`:

    python examples/quickstart.py --checkpoint_dir=/tmp/run --steps=100
    python examples/inference.py --weights=/tmp/run/best-00000100.weights.npz

Without --weights it first trains briefly on 4 (simulated) towers and saves the weights.
"""

import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow loads: no INFO noise

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import app, flags, logging  # noqa: E402

import towers  # noqa: E402

try:
    from examples import quickstart
except ImportError:  # run as a script: examples/ itself is on sys.path
    import quickstart

_WEIGHTS = flags.DEFINE_string("weights", None, "A weights file (.npz, .h5 or checkpoint dir).")
_EXAMPLES = flags.DEFINE_integer("examples", 1000, "Held-out examples to classify.")


def train_on_towers(path: str, num_towers: int = 4, steps: int = 60) -> tf.Module:
    """Trains the quickstart model on `num_towers` devices and saves its weights to `path`."""
    devices = quickstart.choose_devices(num_towers)
    result = quickstart.train(devices, batch_size=128, steps=steps, learning_rate=0.2)
    towers.save_weights(result["model"], path)
    return result["model"]


def load_for_inference(path: str, device: str = "/cpu:0") -> quickstart.ConvNet:
    """A fresh `ConvNet` on one device with the weights at `path`."""
    with tf.device(device):
        model = quickstart.ConvNet(seed=12345)  # its own initial values, all replaced
    towers.restore_weights(model, path)
    return model


def accuracy(model: quickstart.ConvNet, num_examples: int, seed: int = 99) -> float:
    """Top-1 accuracy on held-out synthetic examples."""
    images, labels = quickstart.make_data(num_examples, seed=seed)
    predictions = np.argmax(model(images).numpy(), axis=1)
    return float(np.mean(predictions == labels))


def main(argv: list[str]) -> None:
    """Loads (or first trains and saves) weights, then classifies held-out examples."""
    del argv
    path = _WEIGHTS.value
    if path is None:
        path = os.path.join(tempfile.mkdtemp(), "weights.npz")
        train_on_towers(path)
        logging.info("trained on 4 towers, saved %s", path)
    model = load_for_inference(path)
    logging.info("weights %s: %s", path, sorted(towers.named_variables(model)))
    logging.info(
        "accuracy on %d held-out examples: %.3f", _EXAMPLES.value, accuracy(model, _EXAMPLES.value)
    )


if __name__ == "__main__":
    app.run(main)
