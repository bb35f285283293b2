"""Where a step's time goes: op time inside the towers' forward and backward, and the rest.

Each configuration runs in a v1 `Session` with a full trace, which records every op's run
time per device. Ops in a tower's name scope (`tower_<i>/`, or `gradient_tape/` for a
tape's gradients built outside any) are the towers' forward and backward: the same ops in
every configuration of a model. Transfers and collectives are counted apart ("waits"):
their recorded time includes waiting for a producer or for peers. The rest is the input
split, the gradient reduction, the checks and the update: what a way of training on
towers changes. The rest's op time and op count bound what any reduction scheme can save,
up to the executor's own work per op, which the trace leaves out, and to transfers between
the logical CPU devices of one process, which it does not record. On GPUs only the
executor's entries are read (launch time on the host; kernel times are in per-stream
entries, left out).
"""

import collections
import statistics
import time

import tensorflow as tf

import towers
from towers.bench._models import MODELS, batch
from towers.bench._steps import step_bodies
from towers.bench._tables import format_table
from towers.bench._worker import DEFAULT_BATCH, bench_devices, runnable

TOWER_SCOPES = ("tower_", "gradient_tape/")
WAITS = ("_Send", "_Recv", "_HostSend", "_HostRecv", "CollectiveReduceV2", "NcclAllReduce")
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
    """One row per (model, configuration): the step time and its op time, split in three."""
    devices = bench_devices(num_devices)
    algorithms = runnable(algorithms, devices)
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
                traced = _op_time(session, loss)
            rows.append(
                {
                    "model": model,
                    "towers": num_devices,
                    "config": label,
                    "step_ms": statistics.median(times) * 1e3,
                    **traced,
                }
            )
    return rows


def _op_time(session: tf.compat.v1.Session, loss: tf.Tensor) -> dict:
    """Op ms per step in the towers, in waits and in the rest (medians), the rest's ops."""
    options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
    per_step = {"towers_ms": [], "waits_ms": [], "rest_ms": [], "rest_ops": []}
    types: collections.Counter = collections.Counter()
    for _ in range(TRACED_STEPS):
        metadata = tf.compat.v1.RunMetadata()
        session.run(loss, options=options, run_metadata=metadata)
        step = collections.Counter()
        for device in metadata.step_stats.dev_stats:
            if "/stream:" in device.device or device.device.endswith(("/memcpy", "/sync")):
                continue
            for node in device.node_stats:
                ms = (node.op_end_rel_micros - node.op_start_rel_micros) / 1e3
                label = node.timeline_label
                kind = label.split(" = ", 1)[1].split("(", 1)[0] if " = " in label else "?"
                if kind in WAITS:
                    step["waits_ms"] += ms
                elif node.node_name.startswith(TOWER_SCOPES):
                    step["towers_ms"] += ms
                else:
                    step["rest_ms"] += ms
                    step["rest_ops"] += 1
                    types[kind] += ms * 1e3 / TRACED_STEPS
        for key, values in per_step.items():
            values.append(step[key])
    found = {key: float(statistics.median(values)) for key, values in per_step.items()}
    found["rest_top"] = ", ".join(f"{t} {us:.0f}" for t, us in types.most_common(4))
    return found


def profile_table(rows: list[dict]) -> str:
    """The rows as a table: op time per step inside the towers, in waits, and the rest."""
    header = ["model", "K", "configuration", "step ms", "towers op ms", "waits op ms"]
    header += ["rest op ms", "rest %", "rest ops", "rest's largest op types (op us per step)"]
    lines = []
    for r in rows:
        total = r["towers_ms"] + r["rest_ms"]
        rest_share = 100 * r["rest_ms"] / total if total else 0.0
        lines.append(
            (r["model"], r["towers"], r["config"], r["step_ms"], r["towers_ms"], r["waits_ms"])
            + (r["rest_ms"], rest_share, f"{r['rest_ops']:.0f}", r["rest_top"] or "-")
        )
    note = (
        f"v1 sessions, full traces of {TRACED_STEPS} steps (medians). Op time per step, summed "
        "over devices: in the towers' forward and backward; in transfers and collectives "
        "(waits: they include waiting for producers or peers); and the rest (split, "
        "reduction, checks, update), whose share is of towers + rest. The executor's own work "
        "per op is not in op time, nor (on CPUs) are transfers between devices."
    )
    return format_table(header, lines) + "\n" + note
