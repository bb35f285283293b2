"""ResNet-50 (v1.5) from Keras layers, for the models suite: its FLOPs and its data."""

import functools

import keras
import numpy as np

from towers.bench._keras_layers import Initializers, policy

# Bottleneck blocks per stage, by depth (3 convolutions a block, plus the stem and the head).
RESNET_BLOCKS = {14: (1, 1, 1, 1), 26: (2, 2, 2, 2), 50: (3, 4, 6, 3), 101: (3, 4, 23, 3)}
# A multiply-add is 2 FLOPs; training runs the forward pass once and the backward pass twice
# over (gradients of the inputs and of the weights).
TRAIN_FLOPS_PER_MAC = 2 * 3


def _bn_relu(x, dtype: str, relu: bool = True):
    x = keras.layers.BatchNormalization(momentum=0.9, epsilon=1e-5, dtype=dtype)(x)
    return keras.layers.ReLU(dtype=dtype)(x) if relu else x


def _bottleneck(x, filters: int, stride: int, dtype: str, init: Initializers):
    """ResNet v1.5's bottleneck: the stride on the 3x3 convolution, projection when needed."""
    conv = functools.partial(keras.layers.Conv2D, padding="same", use_bias=False, dtype=dtype)
    shortcut = x
    if stride != 1 or x.shape[-1] != 4 * filters:
        shortcut = conv(4 * filters, 1, strides=stride, kernel_initializer=init())(x)
        shortcut = _bn_relu(shortcut, dtype, relu=False)
    x = _bn_relu(conv(filters, 1, kernel_initializer=init())(x), dtype)
    x = _bn_relu(conv(filters, 3, strides=stride, kernel_initializer=init())(x), dtype)
    x = _bn_relu(conv(4 * filters, 1, kernel_initializer=init())(x), dtype, relu=False)
    return keras.layers.ReLU(dtype=dtype)(keras.layers.Add(dtype=dtype)([x, shortcut]))


def resnet(
    depth: int = 50,
    image_size: int = 224,
    num_classes: int = 1000,
    width: int = 64,
    compute_dtype: str = "float32",
    seed: int = 0,
) -> keras.Model:
    """ResNet v1.5 (bottleneck blocks, stride on the 3x3), images NHWC -> float32 logits.

    Args:
      depth: 50 for ResNet-50; 14 or 26 for small variants (one or two blocks per stage).
      image_size: Height and width of the square RGB input.
      num_classes: Logits per image.
      width: Channels of the stem and of the first stage's bottleneck (64 in ResNet-50).
      compute_dtype: "float32", or "bfloat16" for mixed precision (float32 variables).
      seed: Seeds every initializer: the same seed builds the same weights.

    Returns:
      A functional `keras.Model`; call it with `training=True` (BatchNormalization).

    Raises:
      ValueError: if `depth` or `compute_dtype` is not one of the known values.
    """
    if depth not in RESNET_BLOCKS:
        raise ValueError(f"`depth` must be one of {sorted(RESNET_BLOCKS)}; got depth={depth}.")
    dtype, init = policy(compute_dtype), Initializers(seed)
    images = keras.Input((image_size, image_size, 3), name="images")
    x = keras.layers.Conv2D(
        width, 7, strides=2, padding="same", use_bias=False, kernel_initializer=init(), dtype=dtype
    )(images)
    x = keras.layers.MaxPooling2D(3, 2, padding="same", dtype=dtype)(_bn_relu(x, dtype))
    for stage, blocks in enumerate(RESNET_BLOCKS[depth]):
        for block in range(blocks):
            stride = 2 if stage > 0 and block == 0 else 1
            x = _bottleneck(x, width * 2**stage, stride, dtype, init)
    x = keras.layers.GlobalAveragePooling2D(dtype=dtype)(x)
    x = keras.layers.Dense(
        num_classes, kernel_initializer=init(keras.initializers.GlorotUniform), dtype=dtype
    )(x)
    logits = keras.layers.Activation("linear", dtype="float32", name="logits")(x)
    return keras.Model(images, logits, name=f"resnet{depth}")


def matmul_macs(model: keras.Model) -> int:
    """Forward multiply-adds per example of `model`'s top-level Conv2D and Dense layers.

    Counted from the layers' static output shapes; batch norm, activations, pooling and the
    residual adds (under 1% of ResNet-50's) are left out. ResNet-50 v1.5 at 224 counts
    4.09 G, the figure usually quoted (e.g. torchvision's).
    """
    total = 0
    for layer in model.layers:
        if isinstance(layer, keras.layers.Conv2D):
            kh, kw, cin, cout = layer.kernel.shape
            total += int(np.prod(layer.output.shape[1:-1])) * cout * kh * kw * cin
        elif isinstance(layer, keras.layers.Dense):
            cin, cout = layer.kernel.shape
            total += int(np.prod(layer.output.shape[1:-1])) * cin * cout
    return total


def conv_net_flops_per_example(model: keras.Model) -> float:
    """Training FLOPs per example: `matmul_macs` x 2 x 3 (forward and backward)."""
    return float(TRAIN_FLOPS_PER_MAC * matmul_macs(model))


def image_batch(
    global_batch: int, image_size: int, num_classes: int, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """A fixed random batch: float32 images [batch, size, size, 3] and int32 labels."""
    rng = np.random.default_rng(seed)
    images = rng.standard_normal((global_batch, image_size, image_size, 3), np.float32)
    return images, rng.integers(0, num_classes, global_batch).astype(np.int32)
