"""The benchmark's models: plain `tf.Module`s with their variables built on construction."""

import numpy as np
import tensorflow as tf


class MLP(tf.Module):
    """784-512-10 with ReLU."""

    input_shape = (784,)

    def __init__(self, seed: int = 0):
        super().__init__(name="mlp")
        self.w1 = tf.Variable(_init([784, 512], seed, 1), name="w1")
        self.b1 = tf.Variable(tf.zeros([512]), name="b1")
        self.w2 = tf.Variable(_init([512, 10], seed, 2), name="w2")
        self.b2 = tf.Variable(tf.zeros([10]), name="b2")

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        """Logits."""
        return tf.matmul(tf.nn.relu(tf.matmul(x, self.w1) + self.b1), self.w2) + self.b2


class CNN(tf.Module):
    """28x28x1: conv3x3(32) - pool - conv3x3(64) - global mean - dense(10)."""

    input_shape = (28, 28, 1)

    def __init__(self, seed: int = 0):
        super().__init__(name="cnn")
        self.conv1 = tf.Variable(_init([3, 3, 1, 32], seed, 1), name="conv1")
        self.conv2 = tf.Variable(_init([3, 3, 32, 64], seed, 2), name="conv2")
        self.dense = tf.Variable(_init([64, 10], seed, 3), name="dense")
        self.bias = tf.Variable(tf.zeros([10]), name="bias")

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        """Logits."""
        x = tf.nn.relu(tf.nn.conv2d(x, self.conv1, 1, "SAME"))
        x = tf.nn.max_pool2d(x, 2, 2, "SAME")
        x = tf.nn.relu(tf.nn.conv2d(x, self.conv2, 1, "SAME"))
        return tf.matmul(tf.reduce_mean(x, axis=[1, 2]), self.dense) + self.bias


class ManySmall(tf.Module):
    """50 residual dense layers of width 32 (100 variables, 53 K parameters), then 10 logits."""

    input_shape = (32,)

    def __init__(self, seed: int = 0, depth: int = 50, width: int = 32):
        super().__init__(name="many_small")
        self.kernels = [
            tf.Variable(_init([width, width], seed, i) * 0.5, name=f"w{i}") for i in range(depth)
        ]
        self.biases = [tf.Variable(tf.zeros([width]), name=f"b{i}") for i in range(depth)]
        self.head = tf.Variable(_init([width, 10], seed, depth), name="head")

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        """Logits."""
        for kernel, bias in zip(self.kernels, self.biases):
            x = x + tf.tanh(tf.matmul(x, kernel) + bias)
        return tf.matmul(x, self.head)


MODELS = {"mlp": MLP, "cnn": CNN, "many_small": ManySmall}


def _init(shape: list[int], seed: int, index: int) -> tf.Tensor:
    fan = int(np.prod(shape[:-1])) + shape[-1]
    limit = float(np.sqrt(6.0 / fan))
    return tf.random.stateless_uniform(shape, [seed, index], -limit, limit)


def batch(model_cls, size: int, seed: int = 0) -> tuple[tf.Tensor, tf.Tensor]:
    """A fixed random batch (inputs, integer labels) for `model_cls`."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((size, *model_cls.input_shape)).astype(np.float32)
    return tf.constant(x), tf.constant(rng.integers(0, 10, size), tf.int32)


def mean_loss(model: tf.Module, shard) -> tf.Tensor:
    """Mean softmax cross-entropy of `model` on a shard."""
    x, y = shard
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=model(x)))
