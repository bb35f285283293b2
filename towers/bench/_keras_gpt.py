"""A GPT-style causal LM from Keras layers, for the models suite: its FLOPs and its data."""

import functools

import keras
import numpy as np
import tensorflow as tf

from towers.bench._keras_layers import Initializers, policy


class CausalSelfAttention(keras.layers.Layer):
    """Multi-head causal self-attention: one fused QKV Dense, softmax in float32, a Dense out.

    Written from `Dense` and `keras.ops.dot_product_attention` (rather than
    `keras.layers.MultiHeadAttention`, whose sublayers clone one initializer config, so a
    seeded initializer would start the query, key and value kernels equal).
    """

    def __init__(self, num_heads: int, d_model: int, init: Initializers, **kwargs):
        super().__init__(**kwargs)
        self.num_heads, self.head_dim = num_heads, d_model // num_heads
        dense = functools.partial(keras.layers.Dense, dtype=self.dtype_policy)
        normal = functools.partial(init, keras.initializers.RandomNormal, stddev=0.02)
        self.qkv = dense(3 * d_model, kernel_initializer=normal(), name="qkv")
        self.out = dense(d_model, kernel_initializer=normal(), name="out")

    def call(self, x):
        """[batch, sequence, d_model] -> the same shape."""
        batch, length = tf.shape(x)[0], x.shape[1]
        qkv = tf.reshape(self.qkv(x), [batch, length, 3, self.num_heads, self.head_dim])
        q, k, v = tf.unstack(qkv, axis=2)
        attended = keras.ops.dot_product_attention(q, k, v, is_causal=True)
        return self.out(tf.reshape(attended, [batch, length, self.num_heads * self.head_dim]))


class PositionEmbedding(keras.layers.Layer):
    """Adds a learned [sequence, d_model] table to its input."""

    def __init__(self, length: int, d_model: int, initializer, **kwargs):
        super().__init__(**kwargs)
        self.length, self.d_model, self.initializer = length, d_model, initializer

    def build(self, input_shape):  # noqa: D102
        self.table = self.add_weight(
            shape=(self.length, self.d_model), initializer=self.initializer, name="table"
        )

    def call(self, x):
        """Adds the table (read in the compute dtype) to `x`."""
        return x + self.table


def gpt(
    num_layers: int = 6,
    d_model: int = 768,
    num_heads: int = 12,
    seq_len: int = 512,
    vocab_size: int = 32000,
    compute_dtype: str = "float32",
    seed: int = 0,
) -> keras.Model:
    """A GPT-style causal LM: token ids [batch, seq_len] -> float32 logits [.., vocab_size].

    Pre-LayerNorm blocks (attention, then a 4x GELU MLP, each added back), learned position
    embeddings, a final LayerNorm and an untied output projection (no bias); no dropout.

    Args:
      num_layers: Transformer blocks.
      d_model: Width of the residual stream; a multiple of `num_heads`.
      num_heads: Attention heads.
      seq_len: Tokens per example (the model's static input length).
      vocab_size: Token ids and logits per position.
      compute_dtype: "float32", or "bfloat16" for mixed precision (float32 variables).
      seed: Seeds every initializer: the same seed builds the same weights.

    Returns:
      A functional `keras.Model`.

    Raises:
      ValueError: if `d_model` is not a multiple of `num_heads`, or `compute_dtype` is unknown.
    """
    if d_model % num_heads:
        raise ValueError(
            f"`d_model` must be a multiple of `num_heads`; got d_model={d_model}, "
            f"num_heads={num_heads}."
        )
    dtype, init = policy(compute_dtype), Initializers(seed)
    normal = functools.partial(init, keras.initializers.RandomNormal, stddev=0.02)
    norm = functools.partial(keras.layers.LayerNormalization, epsilon=1e-5, dtype=dtype)
    tokens = keras.Input((seq_len,), dtype="int32", name="tokens")
    x = keras.layers.Embedding(
        vocab_size, d_model, embeddings_initializer=normal(), dtype=dtype, name="token_embedding"
    )(tokens)
    x = PositionEmbedding(seq_len, d_model, normal(), dtype=dtype, name="position_embedding")(x)
    for i in range(num_layers):
        h = CausalSelfAttention(num_heads, d_model, init, dtype=dtype, name=f"attention_{i}")(
            norm(name=f"norm_{i}a")(x)
        )
        x = keras.layers.Add(dtype=dtype)([x, h])
        h = norm(name=f"norm_{i}b")(x)
        h = keras.layers.Dense(4 * d_model, "gelu", kernel_initializer=normal(), dtype=dtype)(h)
        h = keras.layers.Dense(d_model, kernel_initializer=normal(), dtype=dtype)(h)
        x = keras.layers.Add(dtype=dtype)([x, h])
    x = keras.layers.Dense(
        vocab_size, use_bias=False, kernel_initializer=normal(), dtype=dtype, name="lm_head"
    )(norm(name="norm_final")(x))
    logits = keras.layers.Activation("linear", dtype="float32", name="logits")(x)
    return keras.Model(tokens, logits, name=f"gpt{num_layers}x{d_model}")


def gpt_flops_per_token(model: keras.Model) -> float:
    """Training FLOPs per token of a `gpt` model: 6 N + 12 L d T.

    N counts every trainable parameter but the token and position embeddings (lookups, not
    matmuls), so it includes the untied output projection (d x vocab); the second term is
    attention's two [T, T] matmuls, forward and backward, at full T x T (the causal mask
    is not discounted), as in PaLM's (Chowdhery et al., 2022, appendix B) MFU convention.
    """
    embeddings = (model.get_layer("token_embedding"), model.get_layer("position_embedding"))
    skipped = {id(v) for layer in embeddings for v in layer.trainable_weights}
    n = sum(int(np.prod(v.shape)) for v in model.trainable_weights if id(v) not in skipped)
    layers = [la for la in model.layers if isinstance(la, CausalSelfAttention)]
    d_model, seq_len = embeddings[0].output_dim, model.input.shape[1]
    return float(6 * n + 12 * len(layers) * d_model * seq_len)


def token_batch(
    global_batch: int, seq_len: int, vocab_size: int, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """A fixed random batch: int32 token ids [batch, seq_len] and the next token of each."""
    stream = np.random.default_rng(seed).integers(0, vocab_size, (global_batch, seq_len + 1))
    stream = stream.astype(np.int32)
    return stream[:, :-1], stream[:, 1:]
