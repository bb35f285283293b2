"""Whether a change touched the graphs of the models suite's towers rows (no GPU needed).

A timing table holds for a later commit whose rows build the same graphs. This builds the
models suite's `towers replicated*` rows on two CPU devices (the `gpt_tiny` model, K = 1 and
2, compiled and not) and writes one signature per row: how many ops of each type, with how
many data and control inputs, in the step's graph and its function library. Run it at each
commit (this file, with a `git worktree` of the old commit first on `PYTHONPATH`) and compare:

    git worktree add /tmp/old 400de17
    PYTHONPATH=/tmp/old python3 .ci/gpu/graphs.py --out=/tmp/old.json
    PYTHONPATH=. python3 .ci/gpu/graphs.py --out=/tmp/new.json --against=/tmp/old.json

Names are left out (their numbering moves with unrelated code). Session 36 checked it: from
b962407 to 400de17 (the check began waiting for the staging) 11 of the 21 rows differ; from
400de17 to 173ef9f (accumulation and loss-scale paths only) none.
"""

import argparse
import collections
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import towers  # noqa: E402

towers.simulate_devices(2)

import tensorflow as tf  # noqa: E402

from towers.bench._model_steps import model_rows  # noqa: E402
from towers.bench._model_suite import shared_factory  # noqa: E402
from towers.bench._real_models import REAL_MODELS, mean_loss, repeated_dataset  # noqa: E402
from towers.bench._worker import mirrored_strategy  # noqa: E402


def signatures() -> dict[str, dict[str, int]]:
    """Row -> the counts of its ops by type and numbers of data and control inputs."""
    found = {}
    real = REAL_MODELS["gpt_tiny"]
    for k in (1, 2):
        devices = towers.list_devices()[:k]
        for jit in (True, False):
            reference = real.build(compute_dtype="float32")
            make_model = shared_factory(reference, lambda: real.build(compute_dtype="float32"))
            batch = real.batch(8, 0)
            data = tuple(tf.constant(t) for t in batch)
            rows = model_rows(
                make_model,
                mean_loss,
                devices,
                mirrored_strategy(devices),
                repeated_dataset(batch),
                jit_compile=jit,
            )
            for label, config in rows.items():
                if label.startswith("towers replicated"):
                    graph = config().get_concrete_function(data).graph.as_graph_def()
                    nodes = [*graph.node, *(n for f in graph.library.function for n in f.node_def)]
                    counts = collections.Counter(_kind(node) for node in nodes)
                    found[f"K={k} jit={jit} {label}"] = dict(sorted(counts.items()))
    return found


def _kind(node) -> str:
    control = sum(name.startswith("^") for name in node.input)
    return f"{node.op}/{len(node.input) - control}/{control}"


def main() -> None:
    """Writes this checkout's signatures; with `--against`, names the rows that differ."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True, help="where to write this checkout's signatures")
    parser.add_argument("--against", help="another checkout's file: print the rows that differ")
    args = parser.parse_args()
    found = signatures()
    with open(args.out, "w") as out:
        json.dump(found, out, indent=0, sort_keys=True)
    print(f"{len(found)} rows, towers from {towers.__file__}")
    if args.against:
        with open(args.against) as raw:
            other = json.load(raw)
        differ = sorted(set(found) ^ set(other)) + [
            row for row in sorted(found) if row in other and found[row] != other[row]
        ]
        print(f"{len(differ)} of {len(found)} rows differ" + "".join(f"\n  {r}" for r in differ))


if __name__ == "__main__":
    main()
