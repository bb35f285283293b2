"""How fast the non-finite check reads a GPT's gradients on one GPU, in several formulations.

The guard's check (`towers.ops._finite.laid_flags`) reads every all-reduced gradient once
inside each copy's update program; on the H200 it read them at 1.35 TB/s (session 16's
trace). This times, each as its own XLA program over the same buckets (a GPT d=768, 6
layers, its float32 gradients laid in 64 MiB buckets): the check as it is, its block
reduction alone, two float formulations of it (a sum of `x * 0`, NaN where a value is not
finite), a whole-bucket verdict, and an SGD update's pass over the same bytes (read the
gradient and the weight, write the weight) for the bandwidth to compare with.

    python3 .ci/gpu/check_bench.py  # on the device, after the kit; prints a row per variant
"""

import os
import time

import numpy as np
import tensorflow as tf

from towers.ops._finite import BLOCK, laid_flags

D, LAYERS, VOCAB, SEQ = 768, 6, 50257, 512
BUCKET = 64 * 2**20 // 4  # float32 values per 64 MiB bucket


def gpt_sizes() -> list[int]:
    """The sizes of the GPT's weights (embeddings, six layers, the final norm)."""
    layer = [D, D, 3 * D * D, 3 * D, D * D, D, D, D, 4 * D * D, 4 * D, 4 * D * D, D]
    return [VOCAB * D, SEQ * D] + layer * LAYERS + [D, D]


def buckets_of(sizes: list[int]) -> list[list[int]]:
    """`sizes` in order, cut into buckets of at most 64 MiB (a larger tensor alone)."""
    out, here, used = [], [], 0
    for size in sizes:
        if here and used + size > BUCKET:
            out.append(here)
            here, used = [], 0
        here.append(size)
        used += size
    return out + [here]


def timed(fn, args, rounds: int = int(os.environ.get("ROUNDS", "50"))) -> float:
    """Seconds per call of `fn(*args)`, compiled and warmed first, synchronized at the end."""
    fn(*args)  # compile
    tf.nest.map_structure(lambda t: t.numpy(), fn(*args))
    began = time.perf_counter()
    for _ in range(rounds):
        out = fn(*args)
    tf.nest.map_structure(lambda t: t.numpy(), out)
    return (time.perf_counter() - began) / rounds


def main() -> None:
    """Times each variant and checks that the float one finds a NaN."""
    sizes = buckets_of(gpt_sizes())
    with tf.device("/gpu:0"):
        grads = [tf.random.normal([sum(s)]) for s in sizes]
        weights = [tf.Variable(tf.random.normal([sum(s)])) for s in sizes]
    total = sum(sum(s) for s in sizes) * 4

    def blocks(x):
        whole = int(x.shape[0]) // BLOCK
        return tf.reshape(x[: whole * BLOCK], [whole, BLOCK])

    variants = {
        "laid_flags (today)": lambda *g: laid_flags(g, sizes),
        "blocks, reduce_all(is_finite)": lambda *g: [
            tf.reduce_all(tf.math.is_finite(blocks(x)), 1) for x in g
        ],
        "blocks, is_finite(sum(x * 0))": lambda *g: [
            tf.math.is_finite(tf.reduce_sum(blocks(x) * 0, 1)) for x in g
        ],
        "whole, reduce_all(is_finite)": lambda *g: tf.reduce_all(
            tf.stack([tf.reduce_all(tf.math.is_finite(x)) for x in g])
        ),
        "whole, is_finite(sum(x * 0))": lambda *g: tf.math.is_finite(
            tf.add_n([tf.reduce_sum(x * 0) for x in g])
        ),
    }
    print(f"GPT gradients: {total / 1e6:.0f} MB in {len(sizes)} buckets", flush=True)
    with tf.device("/gpu:0"):
        for name, fn in variants.items():
            seconds = timed(tf.function(fn, jit_compile=True), grads)
            rate = total / seconds / 1e12
            print(f"{name:34s} {seconds * 1e3:7.3f} ms  {rate:5.2f} TB/s", flush=True)

        def sgd(*g):
            for w, x in zip(weights, g):
                w.assign_sub(0.01 * x)
            return tf.constant(0.0)

        seconds = timed(tf.function(sgd, jit_compile=True), grads)
        print(
            f"{'SGD pass (3 x the bytes)':34s} {seconds * 1e3:7.3f} ms  "
            f"{3 * total / seconds / 1e12:5.2f} TB/s",
            flush=True,
        )
    bad = [g.numpy() for g in grads]
    bad[1][12345] = np.nan
    with tf.device("/gpu:0"):
        flags = tf.function(variants["blocks, is_finite(sum(x * 0))"], jit_compile=True)(
            *[tf.constant(b) for b in bad]
        )
    print("sum(x * 0) finds the NaN:", not bool(tf.reduce_all(tf.concat(flags, 0))), flush=True)


if __name__ == "__main__":
    main()
