"""The multi-worker benchmark: towers against `MultiWorkerMirroredStrategy` on loopback.

Each peer runs in its own cluster of worker processes (the two runtimes cannot share a
process: each configures TensorFlow's collectives at start-up), with the same model, data,
plain SGD and steps. Every worker trains on its own part of the global batch; the chief
times its steps and its all-reduces and prints the rows.
"""

import functools
import json
import os
import subprocess
import sys
import tempfile
import time

PEERS = ("towers local_first", "towers flat", "multi_worker_mirrored")
DEFAULT_BATCH = {"mlp": 1024, "cnn": 256, "many_small": 1024}


def cluster_rows(
    workers: int, per_worker: list[int], flags: list[str], timeout_seconds: float = 600.0
) -> list[dict]:
    """Runs every peer in its own cluster of `workers` processes; the chief's rows.

    `MultiWorkerMirroredStrategy` takes one device per worker on CPUs (its GPUs otherwise),
    so it runs with one; towers runs with each of `per_worker` (local_first and flat are
    the same with one device, measured once).
    """
    from towers.workers.launch import free_ports, tf_config  # noqa: PLC0415  (no TF import here)

    roles = [("multi_worker_mirrored", 1)]
    for devices in per_worker:
        roles.append(("towers local_first", devices))
        if devices > 1:
            roles.append(("towers flat", devices))
    rows = []
    for peer, devices in roles:
        ports = free_ports(workers)
        command = [
            sys.executable, "-m", "towers.bench", "--suite=workers",
            f"--cluster_role={peer}:{devices}", *flags,
        ]  # fmt: skip
        with tempfile.TemporaryDirectory() as logs:  # files: no pipe fills while one waits
            files = [open(os.path.join(logs, f"{i}.txt"), "w+") for i in range(workers)]  # noqa: SIM115
            procs = [
                subprocess.Popen(
                    command,
                    env={**os.environ, "TF_CONFIG": tf_config(ports, i)},
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
                for i, out in zip(range(workers), files)
            ]
            deadline = time.monotonic() + timeout_seconds
            try:
                for proc in procs:
                    proc.wait(timeout=max(1, deadline - time.monotonic()))
            finally:
                for proc in procs:
                    proc.kill()
            outputs = []
            for out in files:
                out.seek(0)
                outputs.append(out.read())
                out.close()
        for proc, output in zip(procs, outputs):
            if proc.returncode != 0:
                raise RuntimeError(f"{peer} worker failed ({proc.returncode}):\n{output[-3000:]}")
        rows += [json.loads(line) for line in outputs[0].splitlines() if line.startswith("{")]
    return rows


def run_cluster_worker(
    role: str, models: list[str], batch_size: int, steps: int, warmup: int, sizes_kb: list[int]
) -> list[dict]:
    """This worker's part of one peer's measurements; rows only on the chief."""
    peer, devices = role.rsplit(":", 1)
    if peer not in PEERS:
        raise ValueError(f"--cluster_role must be one of {PEERS} with ':devices'; got {role!r}.")
    import tensorflow as tf  # noqa: PLC0415  (the parent process never imports TensorFlow)

    import towers  # noqa: PLC0415

    if peer == "multi_worker_mirrored":
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        index, workers = strategy.cluster_resolver.task_id, strategy.num_replicas_in_sync
        step_of, reduce_of = _mirrored_step(strategy), _mirrored_all_reduce(strategy)
    else:
        if int(devices) > 1:
            towers.simulate_devices(int(devices))
        info = towers.init_workers(heartbeat_seconds=30.0)
        index, workers = info.index, info.num_workers
        local_first, here = peer == "towers local_first", towers.list_devices()
        step_of = functools.partial(_towers_step, devices=here, local_first=local_first)
        reduce_of = _towers_all_reduce(here, local_first)
    from towers.bench._models import MODELS, batch  # noqa: PLC0415
    from towers.bench._worker import time_step  # noqa: PLC0415

    rows = []
    base = {"peer": peer, "devices_per_worker": int(devices), "workers": workers}
    for model in models:
        size = batch_size or DEFAULT_BATCH[model]
        x, y = batch(MODELS[model], size)
        part = size // workers
        mine = (x[index * part : (index + 1) * part], y[index * part : (index + 1) * part])
        step = step_of(model)
        first, median, loss = time_step(step, mine, steps, warmup)
        rows.append({**base, "model": model, "batch": size, "trace_s": first,
                     "step_ms": median * 1e3, "loss": loss})  # fmt: skip
    for kb in sizes_kb:
        reduce = reduce_of(kb * 256)  # float32 elements
        _, median, _ = time_step(reduce, None, steps, warmup)
        rows.append({**base, "model": "all-reduce", "kb": kb, "step_ms": median * 1e3,
                     "mb_per_s": kb / 1024 / median})  # fmt: skip
    if peer != "multi_worker_mirrored":
        towers.barrier("bench_end")
    return rows if index == 0 else []


def _towers_step(model_name: str, devices: list[str], local_first: bool):
    """The bench's replicated towers step, its all-reduce spanning the workers."""
    import towers  # noqa: PLC0415
    from towers.bench._steps import in_function, towers_replicated  # noqa: PLC0415

    algorithm = towers.WorkersAllReduce(local_first=local_first)
    return in_function(functools.partial(towers_replicated, algorithm=algorithm))(
        model_name, devices
    )


def _towers_all_reduce(devices: list[str], local_first: bool):
    import tensorflow as tf  # noqa: PLC0415

    import towers  # noqa: PLC0415

    def reduce_of(elements):
        algorithm = towers.WorkersAllReduce(local_first=local_first)
        values = []
        for i, device in enumerate(devices):
            with tf.device(device):
                values.append(tf.Variable(tf.fill([elements], float(i))))

        @tf.function
        def reduce(unused):  # time_step's data: none here
            del unused
            out = algorithm([v.read_value() for v in values], devices)
            return tf.add_n([o[0] for o in out])

        return reduce

    return reduce_of


def _mirrored_step(strategy):
    import tensorflow as tf  # noqa: PLC0415

    from towers.bench._steps import mirrored_replica_step  # noqa: PLC0415

    def step_of(model_name):
        replica_step = mirrored_replica_step(model_name, strategy)

        @tf.function
        def step(shard):  # one replica per worker: the worker's part is its replica's shard
            losses = strategy.run(replica_step, args=(shard,))
            return strategy.experimental_local_results(losses)[0]  # this worker's, as towers

        return step

    return step_of


def _mirrored_all_reduce(strategy):
    import tensorflow as tf  # noqa: PLC0415

    def reduce_of(elements):
        with strategy.scope():
            value = tf.Variable(tf.fill([elements], 1.0))

        @tf.function
        def reduce(unused):  # time_step's data: none here
            del unused
            out = strategy.run(
                lambda: tf.distribute.get_replica_context().all_reduce("sum", value.read_value())
            )
            return strategy.experimental_local_results(out)[0][0]

        return reduce

    return reduce_of


def workers_table(rows: list[dict]) -> str:
    """Step and all-reduce times, each with its ratio to `MultiWorkerMirroredStrategy`'s."""
    from towers.bench._tables import format_table  # noqa: PLC0415

    mirrored = {(r["model"], r.get("kb")): r["step_ms"] for r in rows if r["peer"] == PEERS[2]}
    header = ["what", "peer", "devices/worker", "ms", "x mirrored", "trace s", "MB/s", "loss"]
    lines = []
    for r in rows:
        what = f"all-reduce {r['kb']} KB" if r["model"] == "all-reduce" else r["model"]
        theirs = mirrored.get((r["model"], r.get("kb")))
        lines.append(
            (
                what,
                r["peer"],
                r["devices_per_worker"],
                r["step_ms"],
                theirs / r["step_ms"] if theirs else "-",
                r.get("trace_s", "-"),
                r.get("mb_per_s", "-"),
                f"{r['loss']:.7g}" if "loss" in r else "-",
            )
        )
    note = (
        f"{rows[0]['workers']} workers on loopback. x mirrored: MultiWorkerMirroredStrategy's "
        "time (custom loop, one device per worker) divided by this row's: above 1, this row "
        "is faster. Steps: median ms on the chief, its part of the global batch; loss: the "
        "chief's last. All-reduce: one float32 tensor of that size per device; MB/s: its size "
        "over the time."
    )
    return format_table(header, lines) + "\n" + note
