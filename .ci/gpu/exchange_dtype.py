"""What sending mixed-precision gradients narrow saves: one model, K devices, interleaved.

On the lent H200, after the kit:

    python3 .ci/gpu/exchange_dtype.py --model=gpt --devices=2

Builds the models suite's "mirrored xla" and "towers replicated xla" rows, and the towers row
again with the gradients' narrow forms hidden while it is traced (`towers.ops._exact_widening`:
each tower's program returns float32 gradients and the exchange moves float32, as before
9630d88). Times the three interleaved (`--steps` rounds) and prints ms per step, the ratio to
MirroredStrategy and the loss, each row as the timing ends. A development tool, not the
package: it reaches into a private module on purpose.
"""

import argparse
import re
import time
from unittest import mock

import tensorflow as tf

from towers.bench._model_steps import model_rows
from towers.bench._model_suite import shared_factory
from towers.bench._real_models import REAL_MODELS, mean_loss, repeated_dataset
from towers.bench._worker import bench_devices, mirrored_strategy, time_interleaved
from towers.ops import _exact_widening
from towers.step import _tower_gradients

HIDDEN = "towers replicated xla, float32 exchange"


def main() -> None:
    """Builds the three rows, times them interleaved, prints one line per row."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="gpt")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--gpu_split_mb", type=int, default=60000)
    parser.add_argument("--batch", type=int, default=0, help="0: 32 (GPT), 256 (ResNet-50)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    devices = bench_devices(args.devices, args.gpu_split_mb if args.devices > 1 else 100000)
    real = REAL_MODELS[args.model]
    reference = real.build(compute_dtype=args.dtype)
    make_model = shared_factory(reference, lambda: real.build(compute_dtype=args.dtype))
    batch = real.batch(args.batch or (32 if "gpt" in args.model else 256), 0)
    with tf.device("/cpu:0"):
        data = tuple(tf.constant(t) for t in batch)
    rows = model_rows(
        make_model, mean_loss, devices, mirrored_strategy(devices), repeated_dataset(batch),
        jit_compile=True,
    )  # fmt: skip
    wanted = r"mirrored xla|towers replicated xla"
    chosen = {k: v for k, v in rows.items() if re.fullmatch(wanted, k)}
    built = {}
    for label, config in [*chosen.items(), (HIDDEN, chosen["towers replicated xla"])]:
        began = time.perf_counter()
        step = config()
        if label == HIDDEN:  # traced (its first call) with every narrow form hidden
            hidden = lambda tensor: None  # noqa: E731
            with (
                mock.patch.object(_exact_widening, "narrow_form", hidden),
                mock.patch.object(_tower_gradients, "narrow_form", hidden),
            ):
                float(step(data))
        else:
            float(step(data))
        built[label] = step
        print(f"built {label}: {time.perf_counter() - began:.1f} s", flush=True)
    timed = time_interleaved(built, data, args.steps, 3)
    mirrored = timed["mirrored xla"][1]
    for label, (_, seconds, loss) in timed.items():
        print(f"{label}: {seconds * 1e3:.2f} ms ({seconds / mirrored:.3f}x), loss {loss:.6f}")


if __name__ == "__main__":
    main()
