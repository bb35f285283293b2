"""How fast the non-finite check reads a GPT's gradients on one GPU, in several formulations.

The guard's check (`towers.ops._finite.laid_flags`) reads every all-reduced gradient once
inside each copy's update program. This times, over the same buckets (a GPT d=768, 6 layers,
its float32 gradients laid in 64 MiB buckets), the check as it is, its block reduction alone,
other formulations of it (a float sum of `x * 0`, NaN where a value is not finite; the largest
magnitude; the largest exponent field, as integers; longer blocks; one verdict per bucket),
and an SGD update's pass over the same bytes (read the gradient and the weight, write the
weight) for the bandwidth to compare with.

Each variant runs `REPEAT` times inside one XLA program (a loop whose every round reads the
gradients scaled by a number the loop carries, so that nothing is computed once for all
rounds): one call per variant, the host's launch cost spread over the rounds. (Session 21's
first version timed one program call per round: every variant came out at 0.23 ms, the
host's cost of a call, not the kernels'.)

    python3 .ci/gpu/check_bench.py  # on the device, after the kit; prints a row per variant
    DTYPE=bfloat16 python3 .ci/gpu/check_bench.py  # the crossed check's own buckets

With `DTYPE=bfloat16` the buckets are what each device checks at K = 2 under mixed precision
(`towers.ops._crossed_flags`: its own bucket of bfloat16 gradients, each term passing when
twice it is finite in float32): the check as it is, and cheaper forms of the same rule (the
exponent field below 254, as integers; one verdict per block or per bucket). The trace at
c3f2c20 (docs/history/benchmarks.md) saw that check take 0.2 ms per logical GPU of an H100, on the
step's critical path: the copies to the other device waited for it.
"""

import os
import time

import numpy as np
import tensorflow as tf

from towers.ops._crossed_flags import _doubled
from towers.ops._finite import BLOCK, laid_flags

D, LAYERS, VOCAB, SEQ = 768, 6, 50257, 512
BUCKET = 64 * 2**20 // 4  # float32 values per 64 MiB bucket
REPEAT = int(os.environ.get("REPEAT", "20"))
EXPONENT = 0x7F800000  # float32's exponent field: all ones for Inf and NaN
HALF_EXPONENT, TWICE_FINITE = 0x7F80, 0x7F00  # bfloat16's field; below 254: 2x fits float32
DTYPE = tf.as_dtype(os.environ.get("DTYPE", "float32"))


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


def blocks(x: tf.Tensor, width: int = BLOCK) -> tf.Tensor:
    """`x`'s whole blocks of `width` values, as rows."""
    whole = int(x.shape[0]) // width
    return tf.reshape(x[: whole * width], [whole, width])


def exponent_ok(x: tf.Tensor) -> tf.Tensor:
    """Per block: the largest exponent field below all ones (an integer max)."""
    bits = tf.bitwise.bitwise_and(tf.bitcast(blocks(x), tf.int32), EXPONENT)
    return tf.reduce_max(bits, 1) < EXPONENT


VARIANTS = {
    "laid_flags (today)": lambda sizes, g: laid_flags(g, sizes),
    "blocks, reduce_all(is_finite)": lambda sizes, g: [
        tf.reduce_all(tf.math.is_finite(blocks(x)), 1) for x in g
    ],
    "blocks of 16384, reduce_all(is_finite)": lambda sizes, g: [
        tf.reduce_all(tf.math.is_finite(blocks(x, 16384)), 1) for x in g
    ],
    "blocks, is_finite(sum(x * 0))": lambda sizes, g: [
        tf.math.is_finite(tf.reduce_sum(blocks(x) * 0, 1)) for x in g
    ],
    "blocks, max(abs(x)) < inf": lambda sizes, g: [
        tf.reduce_max(tf.abs(blocks(x)), 1) < np.inf for x in g
    ],
    "blocks, max of exponent bits": lambda sizes, g: [exponent_ok(x) for x in g],
    "whole, reduce_all(is_finite)": lambda sizes, g: [
        tf.reduce_all(tf.math.is_finite(x))[None] for x in g
    ],
}


def twice_finite_bits(x: tf.Tensor) -> tf.Tensor:
    """Per block of bfloat16 values: each one's double finite in float32, from its bits."""
    bits = tf.cast(tf.bitcast(blocks(x), tf.uint16), tf.int32)
    return tf.reduce_max(tf.bitwise.bitwise_and(bits, HALF_EXPONENT), 1) < TWICE_FINITE


HALF_VARIANTS = {  # the crossed check's rule on its bfloat16 buckets
    "crossed: laid_flags(2 x float32) (today)": lambda sizes, g: laid_flags(
        [_doubled(x) for x in g], sizes
    ),
    "blocks, reduce_all(is_finite(2 x float32))": lambda sizes, g: [
        tf.reduce_all(tf.math.is_finite(blocks(_doubled(x))), 1) for x in g
    ],
    "blocks, exponent bits below 254": lambda sizes, g: [twice_finite_bits(x) for x in g],
    "whole, reduce_all(is_finite(2 x float32))": lambda sizes, g: [
        tf.reduce_all(tf.math.is_finite(_doubled(x)))[None] for x in g
    ],
}


def repeated(variant, sizes: list[list[int]]):
    """`variant` `REPEAT` times in one XLA program; returns the last round's flags."""

    def run(scale, *grads):
        def body(i, s, _):
            flags = variant(sizes, [x * tf.cast(s, x.dtype) for x in grads])
            return i + 1, s * 1.0000001, tf.concat([tf.reshape(f, [-1]) for f in flags], 0)

        first = tf.concat([tf.reshape(f, [-1]) for f in variant(sizes, list(grads))], 0)
        _, _, flags = tf.while_loop(
            lambda i, s, f: i < REPEAT, body, (tf.constant(0), scale, tf.zeros_like(first))
        )
        return flags

    return tf.function(run, jit_compile=True, autograph=False)


def packed(check, sizes: list[list[int]]):
    """A GPT's bfloat16 gradients packed `REPEAT` times in one program, and checked by `check`.

    `check`: a variant run on each round's buckets (None: the packing alone).

    The buckets are the loop's state, so each round writes them whole: the difference
    between a check's row and the packing's alone is what the check adds where it is fused
    into the program that packs (`towers.ops._packing.pack` is TensorFlow's ConcatV2 today).
    """

    def buckets(tensors: list[tf.Tensor]) -> list[tf.Tensor]:
        at, out = 0, []
        for counts in sizes:
            out.append(tf.concat(tensors[at : at + len(counts)], 0))
            at += len(counts)
        return out

    def flags_of(out: list[tf.Tensor]) -> tf.Tensor:
        if check is None:
            return tf.zeros([0], tf.bool)
        return tf.concat([tf.reshape(f, [-1]) for f in check(sizes, out)], 0)

    def run(scale, *tensors):
        def body(i, s, _, __):
            out = buckets([t * tf.cast(s, t.dtype) for t in tensors])
            return i + 1, s * 1.0000001, out, flags_of(out)

        first = buckets(list(tensors))  # (from the arguments: nothing for XLA to fold)
        flags = flags_of(first)
        out = tf.while_loop(
            lambda i, s, b, f: i < REPEAT, body, (tf.constant(0), scale, first, flags)
        )
        return out[2], out[3]

    return tf.function(run, jit_compile=True, autograph=False)


PACKED = {  # (bfloat16 only) the check fused where the buckets are packed
    "pack alone (XLA concatenate)": None,
    "pack + laid_flags(2 x float32) (today's rule)": HALF_VARIANTS[
        "crossed: laid_flags(2 x float32) (today)"
    ],
    "pack + blocks, exponent bits below 254": HALF_VARIANTS["blocks, exponent bits below 254"],
}


def sgd_pass(grads: list[tf.Tensor]):
    """An SGD step over the same bytes, `REPEAT` times in one program (weights as tensors)."""

    def run(scale, *weights):
        def body(i, s, *w):
            return (i + 1, s * 1.0000001, *[v - 0.01 * s * g for v, g in zip(w, grads)])

        out = tf.while_loop(lambda i, s, *w: i < REPEAT, body, (tf.constant(0), scale, *weights))
        return out[2:]

    return tf.function(run, jit_compile=True, autograph=False)


def timed(fn, *args) -> float:
    """Seconds per round of `fn(*args)` (`REPEAT` rounds a call), after a compiling call."""
    tf.nest.map_structure(lambda t: t.numpy(), fn(*args))
    began = time.perf_counter()
    tf.nest.map_structure(lambda t: t.numpy(), fn(*args))
    return (time.perf_counter() - began) / REPEAT


def main() -> None:
    """Times each variant and checks that each finds a NaN and an Inf."""
    sizes = buckets_of(gpt_sizes())
    scale = tf.constant(1.0)
    variants = HALF_VARIANTS if DTYPE == tf.bfloat16 else VARIANTS
    with tf.device("/gpu:0"):
        grads = [tf.cast(tf.random.normal([sum(s)]), DTYPE) for s in sizes]
        weights = [tf.random.normal([sum(s)]) for s in sizes]
    total = sum(sum(s) for s in sizes) * DTYPE.size
    mb, kind = total / 1e6, DTYPE.name
    print(f"GPT gradients: {mb:.0f} MB of {kind} in {len(sizes)} buckets, {REPEAT} rounds")
    with tf.device("/gpu:0"):
        for name, variant in variants.items():
            seconds = timed(repeated(variant, sizes), scale, *grads)
            rate = total / seconds / 1e12
            print(f"{name:40s} {seconds * 1e3:7.3f} ms  {rate:5.2f} TB/s", flush=True)
        if DTYPE == tf.bfloat16:
            tensors = [tf.cast(tf.random.normal([n]), DTYPE) for n in gpt_sizes()]
            for name, check in PACKED.items():
                seconds = timed(packed(check, sizes), scale, *tensors)
                rate = 2 * total / seconds / 1e12
                print(f"{name:40s} {seconds * 1e3:7.3f} ms  {rate:5.2f} TB/s (2 x)", flush=True)
        seconds = timed(sgd_pass([tf.cast(g, tf.float32) for g in grads]), scale, *weights)
        rate = 3 * total * 4 / DTYPE.size / seconds / 1e12
        print(f"{'SGD pass (3 x the bytes)':40s} {seconds * 1e3:7.3f} ms  {rate:5.2f} TB/s")
    for bad in (np.nan, np.inf, 2e38):  # (2e38: finite, but twice it is not)
        spoiled = [g.numpy().astype(np.float32) for g in grads]
        spoiled[1][12345] = bad
        with tf.device("/gpu:0"):
            spoiled = [tf.cast(tf.constant(s), DTYPE) for s in spoiled]
            for name, variant in variants.items():
                if bad == 2e38 and DTYPE != tf.bfloat16:
                    continue  # (the float32 variants check finiteness alone)
                flags = tf.function(lambda *g, v=variant: v(sizes, list(g)), jit_compile=True)(
                    *spoiled
                )
                found = not bool(tf.reduce_all(tf.concat([tf.reshape(f, [-1]) for f in flags], 0)))
                if not found:
                    print(f"{name} misses a {bad}", flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    main()
