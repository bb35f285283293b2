"""Where a step's time goes: op time inside the towers' forward and backward, and the rest.

Each configuration runs in a v1 `Session` with a full trace, which records every op's run
time per device. Ops in a tower's name scope (`tower_<i>/`) or in the tape's
(`gradient_tape/`) are the towers' forward and backward, the same ops in every
configuration; the rest is the input split, the gradient reduction, the checks and the
update: all that a way of training on towers can change. If the rest is 3% of the op time,
no reduction scheme makes that step 10% faster.
"""

import collections
import statistics
import time

import tensorflow as tf

import towers
from towers.bench._models import MODELS, batch
from towers.bench._steps import step_bodies
from towers.bench._tables import format_table
from towers.bench._worker import DEFAULT_BATCH

TOWER_SCOPES = ("tower_", "gradient_tape/")
TRACED_STEPS = 5


def profile_rows(
    num_devices: int,
    *,
    models: list[str],
    batch_size: int,
    steps: int,
    warmup: int,
    algorithms: list[str],
    bucket_bytes: int | None,
    optimizer: str = "sgd",
) -> list[dict]:
    """One row per (model, configuration): the step time and its op time, split in two."""
    if not tf.config.list_physical_devices("GPU"):
        towers.simulate_devices(num_devices)
    devices = towers.list_devices(num=num_devices)
    rows = []
    for model in models:
        size = batch_size or DEFAULT_BATCH[model]
        data = tuple(t.numpy() for t in batch(MODELS[model], size))
        for label, body in step_bodies(algorithms, bucket_bytes, optimizer).items():
            if label == "one device":
                continue
            graph = tf.Graph()
            with graph.as_default():
                loss = body(model, devices)(tuple(tf.constant(t) for t in data))
                init = tf.compat.v1.global_variables_initializer()
            with tf.compat.v1.Session(graph=graph, config=towers.session_config()) as session:
                session.run(init)
                for _ in range(warmup + 1):
                    session.run(loss)
                times = []
                for _ in range(steps):
                    began = time.perf_counter()
                    session.run(loss)
                    times.append(time.perf_counter() - began)
                towers_us, rest_us, rest_ops = _op_time(session, loss)
            rows.append(
                {
                    "model": model,
                    "towers": num_devices,
                    "config": label,
                    "step_ms": statistics.median(times) * 1e3,
                    "towers_ms": towers_us / 1e3,
                    "rest_ms": rest_us / 1e3,
                    "rest_top": ", ".join(f"{t} {n:.0f}" for t, n in rest_ops.most_common(4)),
                }
            )
    return rows


def _op_time(session: tf.compat.v1.Session, loss: tf.Tensor) -> tuple:
    """Mean op microseconds per step inside and outside the towers, the rest's op types."""
    options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
    inside = outside = 0
    types: collections.Counter = collections.Counter()
    for _ in range(TRACED_STEPS):
        metadata = tf.compat.v1.RunMetadata()
        session.run(loss, options=options, run_metadata=metadata)
        for device in metadata.step_stats.dev_stats:
            for node in device.node_stats:
                micros = node.op_end_rel_micros
                if node.node_name.startswith(TOWER_SCOPES):
                    inside += micros
                    continue
                outside += micros
                label = node.timeline_label
                kind = label.split(" = ", 1)[1].split("(", 1)[0] if " = " in label else "other"
                types[kind] += micros / TRACED_STEPS
    return inside / TRACED_STEPS, outside / TRACED_STEPS, types


def profile_table(rows: list[dict]) -> str:
    """The rows as a table: op time per step inside and outside the towers."""
    header = ["model", "K", "configuration", "step ms", "towers op ms", "rest op ms", "rest %"]
    header.append("rest's largest op types (op us per step)")
    lines = []
    for r in rows:
        total = r["towers_ms"] + r["rest_ms"]
        rest_share = 100 * r["rest_ms"] / total if total else 0.0
        lines.append(
            (r["model"], r["towers"], r["config"], r["step_ms"], r["towers_ms"], r["rest_ms"])
            + (rest_share, r["rest_top"] or "-")
        )
    note = (
        "v1 sessions, full traces of 5 steps. towers op ms: op time per step (summed over "
        "devices) in the towers' forward and backward; rest: everything else (split, "
        "reduction, checks, update). Op time leaves out the executor's own work per op."
    )
    return format_table(header, lines) + "\n" + note
