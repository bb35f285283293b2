"""`python -m towers.bench`: the flags, and one worker process per device count."""

import json
import os
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402
from absl import app, flags  # noqa: E402

from towers.bench import (  # noqa: E402
    _cluster,
    _memory,
    _profile,
    _state_memory,
    _tables,
    _worker,
)

MODELS_SUITE = ["resnet50", "gpt"]  # the models suite's default --models
MODELS_BATCH = {"resnet50": 256, "gpt": 32, "resnet_small": 16, "gpt_tiny": 8}

_SUITE = flags.DEFINE_enum(
    "suite",
    "step",
    ["step", "profile", "weights", "memory", "state", "workers", "models"],
    "What to measure.",
)
_MODELS = flags.DEFINE_list(
    "models",
    ["mlp", "cnn", "many_small"],
    "Models (step suite); the models suite's: resnet50, gpt (default), resnet_small, gpt_tiny.",
)
_COMPUTE = flags.DEFINE_enum(
    "compute_dtype", "bfloat16", ["float32", "bfloat16"], "The models suite's compute dtype."
)
_COMPILED = flags.DEFINE_list(
    "compiled", ["plain", "xla"], "The models suite's rows: uncompiled (plain), XLA (xla)."
)
_PEAK = flags.DEFINE_float("peak_tflops", 790.0, "A device's peak TFLOP/s (models suite MFU).")
_CONFIGS = flags.DEFINE_string(
    "configs", ".*", "The models suite's configurations: a regular expression on their labels."
)
_ROWS_FROM = flags.DEFINE_list(
    "rows_from",
    [],
    "The models suite: read these workers' files (one process each) instead of running; print "
    "each target's ratio per process and the median.",
)
_TOWERS = flags.DEFINE_list("towers", ["1", "4", "8"], "Device counts, one process each.")
_BATCH = flags.DEFINE_integer("batch_size", 0, "Global batch; 0 for each model's default.")
_STEPS = flags.DEFINE_integer("steps", 30, "Timed steps after warm-up; the median is shown.")
_WARMUP = flags.DEFINE_integer("warmup", 5, "Untimed steps after the first call.")
_TRACE_BUILDS = flags.DEFINE_integer(
    "trace_builds",
    3,
    "Fresh builds whose median first call the targets' trace ratio takes.",
    lower_bound=1,
)
_ALGORITHMS = flags.DEFINE_list(
    "algorithms", ["reduce_broadcast", "ring", "collective"], "Replicated all-reduces."
)
_OPTIMIZER = flags.DEFINE_enum(
    "optimizer", "sgd", ["sgd", "momentum", "adam"], "The rule every configuration uses."
)
_MICRO = flags.DEFINE_list(
    "micro_batches", ["1", "4"], "Micro-batches to compare (memory suite, first of --towers)."
)
_BUCKET = flags.DEFINE_integer(
    "bucket_bytes", 64 * 2**20, "Replicated rows' packing bucket; 0 for none (ps rows: both ways)."
)
_WORKER = flags.DEFINE_integer("worker_devices", 0, "Internal: run as a worker with K devices.")
_SHARDED = flags.DEFINE_bool(
    "shard_optimizer_state", False, "Internal: the state suite worker's configuration."
)
_GPU_SPLIT = flags.DEFINE_integer(
    "gpu_split_mb", 0, "Split the first GPU into K logical GPUs of this many MiB for K towers."
)
_TF32 = flags.DEFINE_bool(
    "tf32", True, "TensorFloat-32 in float32 matmuls and convolutions (TensorFlow's default)."
)
_WEIGHTS_MB = flags.DEFINE_integer("weights_mb", 100, "Size of the weights (weights suite).")
_NUM_VARIABLES = flags.DEFINE_integer("num_variables", 20, "Variables the weights are split in.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Runs per weights measurement; the median.")
_WORKERS = flags.DEFINE_integer("workers", 2, "Worker processes (workers suite).")
_PER_WORKER = flags.DEFINE_list("per_worker", ["1", "2"], "Devices per worker (workers suite).")
_SIZES_KB = flags.DEFINE_list(
    "sizes_kb", ["4", "4096", "32768"], "All-reduce sizes in KB (workers suite)."
)
_ROLE = flags.DEFINE_string("cluster_role", "", "Internal: run as a worker, 'peer:devices'.")


def step_suite_rows(models: list[str], device_counts: list[int], argv_flags: list[str]) -> list:
    """Runs one worker process per device count and collects their rows."""
    rows = []
    for count in device_counts:
        command = [sys.executable, "-m", "towers.bench", f"--worker_devices={count}", *argv_flags]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"bench worker for {count} devices failed:\n{done.stderr[-3000:]}")
        rows += [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        for line in done.stderr.splitlines():  # the worker's own notes
            if line.startswith("bench: "):
                print(line, file=sys.stderr)
    return rows


def _run_flags() -> list[str]:
    """The flags every worker process of the step and workers suites gets as given."""
    return [
        f"--models={','.join(_MODELS.value)}",
        f"--batch_size={_BATCH.value}",
        f"--steps={_STEPS.value}",
        f"--warmup={_WARMUP.value}",
        f"--gpu_split_mb={_GPU_SPLIT.value}",
        f"--tf32={_TF32.value}",
    ]


def main(argv: list[str]) -> None:
    """Runs the chosen suite and prints its table."""
    del argv
    tf.config.experimental.enable_tensor_float_32_execution(_TF32.value)
    if _WORKER.value:  # before any suite lists them: the logical GPUs, if asked for
        _worker.bench_devices(_WORKER.value, _GPU_SPLIT.value)
    if _SUITE.value == "weights":
        print(_tables.weights_report(_WEIGHTS_MB.value, _NUM_VARIABLES.value, _REPEATS.value))
        return
    if _SUITE.value == "workers":
        sizes = [int(kb) for kb in _SIZES_KB.value]
        if _ROLE.value:
            rows = _cluster.run_cluster_worker(
                _ROLE.value, _MODELS.value, _BATCH.value, _STEPS.value, _WARMUP.value, sizes
            )
            for row in rows:
                print(json.dumps(row), flush=True)
            return
        passed = [*_run_flags(), f"--sizes_kb={','.join(_SIZES_KB.value)}"]
        per_worker = [int(d) for d in _PER_WORKER.value]
        print(_cluster.workers_table(_cluster.cluster_rows(_WORKERS.value, per_worker, passed)))
        return
    if _SUITE.value == "models":
        _models_suite()
        return
    if _SUITE.value == "state":
        _state_suite()
        return
    if _SUITE.value == "memory":
        towers_, batch = int(_TOWERS.value[0]), _BATCH.value or 8192
        rows = _memory.peak_megabytes(towers_, batch, [int(m) for m in _MICRO.value])
        title = f"memory: 784-1024-1024-10, {towers_} tower(s), global batch {batch}, 3 steps"
        header = ["micro-batches", "peak MB (tower devices)", "loss"]
        print(
            title
            + "\n"
            + _tables.format_table(header, [(m, mb, f"{loss:.6f}") for m, mb, loss in rows])
        )
        return
    settings = dict(
        models=_MODELS.value,
        batch_size=_BATCH.value,
        steps=_STEPS.value,
        warmup=_WARMUP.value,
        algorithms=_ALGORITHMS.value,
        bucket_bytes=_BUCKET.value or None,
        optimizer=_OPTIMIZER.value,
    )
    profile = _SUITE.value == "profile"
    if _WORKER.value:
        if profile:
            rows = _profile.profile_rows(_WORKER.value, **settings)
        else:
            rows = _worker.run_worker(_WORKER.value, **settings, trace_builds=_TRACE_BUILDS.value)
        for row in rows:
            print(json.dumps(row), flush=True)
        return
    passed = [
        *_run_flags(),
        f"--algorithms={','.join(_ALGORITHMS.value)}",
        f"--bucket_bytes={_BUCKET.value}",
        f"--optimizer={_OPTIMIZER.value}",
        f"--suite={_SUITE.value}",
        f"--trace_builds={_TRACE_BUILDS.value}",
    ]
    rows = step_suite_rows(_MODELS.value, [int(t) for t in _TOWERS.value], passed)
    if profile:
        print(_profile.profile_table(rows))
        return
    print(_tables.step_table(rows))
    print()
    print(_tables.targets_table(rows))


def _state_suite() -> None:
    """The state suite: a worker's row as a JSON line, or the driver's table.

    The driver runs each device count unsharded and sharded, one process each.
    """
    batch = _BATCH.value or 256
    if _WORKER.value:
        devices = _worker.bench_devices(_WORKER.value, _GPU_SPLIT.value)
        row = _state_memory.state_row(
            devices, _SHARDED.value, _OPTIMIZER.value, batch, _STEPS.value
        )
        print(json.dumps(row), flush=True)
        return
    rows = []
    for count in [int(t) for t in _TOWERS.value]:
        for sharded in (False, True):
            flags_ = [
                *_run_flags(),
                "--suite=state",
                f"--optimizer={_OPTIMIZER.value}",
                f"--shard_optimizer_state={sharded}",
            ]
            rows += step_suite_rows([], [count], flags_)
    print(_state_memory.state_table(rows, _OPTIMIZER.value))


def _models_suite() -> None:
    """The models suite: a worker's rows as JSON lines, or the driver's tables."""
    models = _MODELS.value if _MODELS.present else MODELS_SUITE
    if _ROWS_FROM.value:  # several processes' rows, summarised
        from towers.bench import _spread

        processes = _spread.read_processes(_ROWS_FROM.value)
        print(_spread.step_times_table(processes))
        print()
        print(_spread.spread_table(processes))
        return
    if _WORKER.value:
        from towers.bench import _model_suite  # Keras is imported for this suite alone

        devices = _worker.bench_devices(_WORKER.value, _GPU_SPLIT.value)
        strategy = _worker.mirrored_strategy(devices)
        for model in models:
            rows = _model_suite.suite_rows(
                model,
                devices,
                strategy,
                global_batch=_BATCH.value or MODELS_BATCH[model],
                steps=_STEPS.value,
                warmup=_WARMUP.value,
                compute_dtype=_COMPUTE.value,
                compiled=tuple(way == "xla" for way in _COMPILED.value),
                peak_tflops=_PEAK.value,
                configs=_CONFIGS.value,
            )
            for row in rows:
                print(json.dumps(row), flush=True)
        return
    passed = [
        *_run_flags(),
        "--suite=models",
        f"--models={','.join(models)}",
        f"--compute_dtype={_COMPUTE.value}",
        f"--compiled={','.join(_COMPILED.value)}",
        f"--peak_tflops={_PEAK.value}",
        f"--configs={_CONFIGS.value}",
    ]
    from towers.bench import _model_suite

    rows = step_suite_rows(models, [int(t) for t in _TOWERS.value], passed)
    print(_model_suite.models_table(rows))
    print()
    print(_model_suite.targets_table(rows))


if __name__ == "__main__":
    app.run(main)
