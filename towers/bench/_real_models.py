"""The models suite's models (ResNet-50, a GPT-style LM), their batches, loss and FLOPs.

A `RealModel` bundles a builder with its fixed random batch and its training FLOPs per item
(an image, or a token), so every configuration of the suite treats the two alike. The models
are Keras functional models with seeded initializers (no downloaded weights), used only as
building blocks called inside the benchmark's own steps (never `compile`/`fit`).
"""

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from towers.bench._keras_gpt import gpt, gpt_flops_per_token, token_batch
from towers.bench._keras_resnet import conv_net_flops_per_example, image_batch, resnet


def repeated_dataset(batch: tuple[np.ndarray, ...]) -> tf.data.Dataset:
    """A dataset whose every element is `batch`, repeated without end.

    Batched from its examples, so that `tf.distribute` can split each element into replica
    shards, then cached: later elements are not rebuilt from the examples.
    """
    size = len(batch[0])
    dataset = tf.data.Dataset.from_tensor_slices(batch).batch(size, drop_remainder=True)
    return dataset.cache().repeat().prefetch(2)


def mean_loss(model: Any, shard: tuple) -> tf.Tensor:
    """Mean sparse softmax cross-entropy of `model`'s logits over a shard (every token)."""
    inputs, labels = shard
    logits = tf.cast(model(inputs, training=True), tf.float32)
    losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    return tf.reduce_mean(losses)


@dataclasses.dataclass(frozen=True)
class RealModel:
    """A model of the suite: how to build it, its batch, and what a step's work is.

    Attributes:
      build: (compute_dtype=..., seed=...) -> a fresh `keras.Model`.
      batch: (global_batch, seed) -> (inputs, labels) as numpy arrays.
      flops_per_item: model -> training FLOPs per item.
      item: What throughput counts: "images" or "tokens".
      items_per_example: Items in one example of the batch (1, or the sequence length).
    """

    build: Callable[..., Any]
    batch: Callable[[int, int], tuple[np.ndarray, np.ndarray]]
    flops_per_item: Callable[[Any], float]
    item: str
    items_per_example: int


def _resnet_model(**config) -> RealModel:
    return RealModel(
        build=functools.partial(resnet, **config),
        batch=lambda size, seed=0: image_batch(
            size, config["image_size"], config["num_classes"], seed
        ),
        flops_per_item=conv_net_flops_per_example,
        item="images",
        items_per_example=1,
    )


def _gpt_model(**config) -> RealModel:
    return RealModel(
        build=functools.partial(gpt, **config),
        batch=lambda size, seed=0: token_batch(size, config["seq_len"], config["vocab_size"], seed),
        flops_per_item=gpt_flops_per_token,
        item="tokens",
        items_per_example=config["seq_len"],
    )


REAL_MODELS = {
    "resnet50": _resnet_model(depth=50, image_size=224, num_classes=1000, width=64),
    "resnet_small": _resnet_model(depth=14, image_size=32, num_classes=10, width=16),
    "gpt": _gpt_model(num_layers=6, d_model=768, num_heads=12, seq_len=512, vocab_size=32000),
    "gpt_tiny": _gpt_model(num_layers=2, d_model=64, num_heads=4, seq_len=32, vocab_size=512),
}
