"""Where a models-suite step's time goes on the GPU: a profiler trace of a few steps per row.

On the lent H200, after the kit:

    python3 .ci/gpu/trace.py --devices=2 --configs='^(mirrored xla|towers replicated xla)$'
    python3 .ci/gpu/trace.py --devices=1 --plain --tail_ms=3 --configs='^towers replicated'
    python3 .ci/gpu/trace.py --model=resnet50 --batch=256 --devices=1 --timed=20 --resident \
        --configs='^(one device xla|towers replicated xla|towers replicated xla, no guard)$'

Builds the models suite's rows (as `python -m towers.bench --suite=models` does), times them
interleaved (the median, the 10th and 90th percentiles and every timed step in order), then
traces `--steps` steps of each with TensorFlow's profiler and prints, per row: each traced
step's wall time on the host, each GPU stream's busy time and the kernels by time, and for
the slowest traced step its host ops, the idle gaps over 50 us on the GPU (all streams
together) and each stream's segments; with `--tail_ms`, every event of the last step's
end, GPU and host (where a step's last milliseconds go: the update, the check, the loss's
copies). The raw traces go to $OUT
(gzipped xplane, one per row and run) for a closer look. `--resident` adds the floor's and
towers' compiled rows (at K = 1) fed one batch held on the GPU: each row's step without the
copy of its input (the ResNet-50's 154 MB a step), beside the same row fed as the suite feeds it.
`--staged_after` adds towers' rows with the next batch staged once the programs are queued
(each copy after its device's programs, never beside them: no race between the two); `--pinned` adds
towers' rows with each staged shard made a fresh (pinned) host tensor before its copy;
`--pageable` adds them with each shard sent as split (as staged before session 40);
`--timestamped` runs every row with TensorFlow's timestamped GPU allocator (the
whole process), under which a copy to a GPU does not wait for the kernels queued before it.
`--copy_first` adds towers' K = 1 rows with the program waiting for host ops after the next
batch's fetch, so that its copy is queued first.
"""

import argparse
import collections
import glob
import gzip
import os
import re
import shutil
import sys
import time

import tensorflow as tf

import towers
from towers.bench._model_steps import model_rows
from towers.bench._model_suite import shared_factory
from towers.bench._real_models import REAL_MODELS, mean_loss, repeated_dataset
from towers.bench._worker import bench_devices, mirrored_strategy, time_interleaved


def main() -> None:
    """Builds, times and traces the rows; prints what each trace says."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="gpt")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--gpu_split_mb", type=int, default=0, help="0: as .ci/gpu/models.sh")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--configs", default="^(mirrored xla|towers replicated xla)$")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--timed", type=int, default=10)
    parser.add_argument("--plain", action="store_true", help="the uncompiled rows")
    parser.add_argument("--tail_ms", type=float, default=0, help="list the last step's end")
    parser.add_argument(
        "--before_35",
        action="store_true",
        help='"towers replicated" again, its check built as before session 35 (one uncompiled '
        "copy's update program judges, and the check waits for it)",
    )
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp/trace_out"))
    parser.add_argument(
        "--host_loss",
        action="store_true",
        help='"towers replicated" twice more, its loss returned from its host copy (one copy '
        "whose check runs beside the update): after the check, and after the check and updates",
    )
    parser.add_argument("--no_trace", action="store_true", help="time the rows only")
    parser.add_argument(
        "--timestamped",
        action="store_true",
        help="every row with TensorFlow's timestamped GPU allocator (the whole process): a "
        "copy to a GPU then waits for no kernel queued before it, only for its memory",
    )
    parser.add_argument(
        "--resident",
        action="store_true",
        help="at K = 1, each chosen row of the floor and towers compiled again, its batch "
        "already on the GPU (no staging, no copy to the device): the step without the input",
    )
    parser.add_argument(
        "--staged_after",
        action="store_true",
        help='"towers replicated xla" and its "no guard" row again, the next batch staged '
        "once the step's programs are queued (its copies then wait for them)",
    )
    parser.add_argument(
        "--copy_first",
        action="store_true",
        help='at K = 1, "towers replicated xla" and its "no guard" row again, the program '
        "waiting for a few host ops after the next batch's host tensor, so that its copy to "
        "the GPU is queued before the program (and overlaps it)",
    )
    parser.add_argument(
        "--pageable",
        action="store_true",
        help='"towers replicated xla" and its "no guard" row again, each shard of the next '
        "batch sent as the split made it (pageable: before session 40's fresh host copy)",
    )
    parser.add_argument(
        "--pinned",
        action="store_true",
        help='"towers replicated xla" and its "no guard" row again, each shard of the next '
        "batch copied to a fresh host tensor first (session 37's study; since 5f0d874 the "
        "library does this itself, and the row makes a second host copy)",
    )
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.timestamped:
        _timestamped_allocator()
    devices = bench_devices(args.devices, args.gpu_split_mb or _split_mb(args.devices))
    real = REAL_MODELS[args.model]
    build = lambda: real.build(compute_dtype=args.dtype)  # noqa: E731
    reference = build()
    make_model = shared_factory(reference, build)
    batch = real.batch(args.batch, 0)
    with tf.device("/cpu:0"):
        data = tuple(tf.constant(t) for t in batch)
    strategy = mirrored_strategy(devices)
    rows = model_rows(
        make_model,
        mean_loss,
        devices,
        strategy,
        repeated_dataset(batch),
        jit_compile=not args.plain,
    )
    chosen = {label: row for label, row in rows.items() if re.search(args.configs, label)}
    if args.before_35:
        chosen["towers replicated, check before session 35"] = _before_35(rows["towers replicated"])
    if args.host_loss:
        for updates in (False, True):
            label = "towers replicated, loss from the host" + (
                " after the updates" if updates else ""
            )
            chosen[label] = _host_loss(rows["towers replicated"], updates)
    if args.resident:
        chosen.update(_resident(chosen, make_model, devices, repeated_dataset(batch)))
    if args.copy_first and args.devices != 1:  # (one-program steps)
        raise ValueError(f"--copy_first is for one device; got {args.devices}.")
    for wanted, how, patched in (
        (args.staged_after, "staged after the program", _staged_after),
        (args.copy_first, "its copy queued first", _copy_first),
        (args.pinned, "staged from pinned memory", _pinned),
        (args.pageable, "staged from pageable memory", _pageable),
    ):
        for label in ("towers replicated xla", "towers replicated xla, no guard"):
            if wanted and label in chosen:
                chosen[f"{label}, {how}"] = patched(rows[label])
    built = {}
    for label, config in chosen.items():
        began = time.perf_counter()
        built[label] = config()
        float(built[label](data))  # (traced here: a patched build's patch holds through it)
        print(f"built {label}: {time.perf_counter() - began:.1f} s", flush=True)
    record: dict = {}
    for label, (_, seconds, loss) in time_interleaved(built, data, args.timed, 3, record).items():
        each = sorted(record[label])
        tenth, ninth = each[len(each) // 10], each[(len(each) * 9) // 10]
        print(
            f"timed {label}: {seconds * 1e3:.2f} ms (10% {tenth * 1e3:.2f}, 90% "
            f"{ninth * 1e3:.2f}; in order: {' '.join(f'{t * 1e3:.0f}' for t in record[label])}),"
            f" loss {loss:.6f}",
            flush=True,
        )
    for n, (label, step) in enumerate(built.items() if not args.no_trace else ()):
        logdir = os.path.join("/tmp/trace", str(n))
        shutil.rmtree(logdir, ignore_errors=True)
        walls = []
        options = tf.profiler.experimental.ProfilerOptions(
            host_tracer_level=3, device_tracer_level=1
        )
        tf.profiler.experimental.start(logdir, options=options)
        for i in range(args.steps):
            began = time.perf_counter()
            with tf.profiler.experimental.Trace("towers_step", step_num=i):
                float(step(data))
            walls.append((time.perf_counter() - began) * 1e3)
        tf.profiler.experimental.stop()
        (path,) = glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True)
        name = f"trace_k{args.devices}{'_plain' if args.plain else ''}_{n}"  # one per run
        with open(path, "rb") as raw, gzip.open(f"{args.out}/{name}.xplane.pb.gz", "wb") as out:
            shutil.copyfileobj(raw, out)
        print(f"\n== {label} ({name}): host walls {', '.join(f'{w:.2f}' for w in walls)} ms")
        summarize(path, args.steps)
        if args.tail_ms:
            tail(path, args.tail_ms)
        sys.stdout.flush()


def _patched(config, patches: list):
    """`config`, its step built and first called (traced) under `patches`: (module, name, value)."""
    import contextlib
    from unittest import mock

    def patching():
        stack = contextlib.ExitStack()
        for module, name, value in patches:
            stack.enter_context(mock.patch.object(module, name, value))
        return stack

    def built():
        with patching():
            step = config()
        traced = []

        def call(data):
            if traced:
                return step(data)
            traced.append(True)
            with patching():  # (the first call traces the step's graph)
                return step(data)

        return call

    return built


def _before_35(config):
    """`config`, its step built with the check of before session 35."""
    from towers.step import _apply_reduced, _nonfinite, _train_step

    def judged_inside(reduced, grads, nonfinite, *rest):  # (one copy under "raise" too)
        return _nonfinite.judged_inside(reduced, grads, nonfinite and "skip", *rest)

    def writes_choose(optimizer, jit, state, accumulate, scale, *rest):  # (compiled only)
        return _nonfinite.writes_choose(optimizer, jit, state, accumulate, scale)

    return _patched(
        config,
        [
            (_apply_reduced, "judged_inside", judged_inside),
            (_train_step, "writes_choose", writes_choose),
        ],
    )


def _host_loss(config, updates: bool):
    """`config`, where one copy's early check returns the loss from its host copy."""
    from towers.ops.internal import host_scope, update_ops
    from towers.step import _nonfinite, _train_step

    def checked_loss(verdict, ups, loss, outputs, exchanged=None, staging=()):
        if exchanged is None or len(exchanged) != 1 or verdict.mode != "raise":
            return _nonfinite.checked_loss(verdict, ups, loss, outputs, exchanged, staging)
        with host_scope():
            copied = tf.identity(loss)
            check = _nonfinite.raised(verdict, [exchanged, copied, outputs, *staging])
            with tf.control_dependencies((update_ops(ups) if updates else []) + check):
                return tf.identity(copied)

    return _patched(config, [(_train_step, "checked_loss", checked_loss)])


def _resident(chosen: dict, make_model, devices: list[str], dataset) -> dict:
    """The floor's and towers' compiled rows among `chosen`, fed one batch held on the GPU.

    Every fed row copies a batch to the device each step (the ResNet-50's, 154 MB of float32
    images): the floor before its program, the staged rows beside it. These rows take one
    batch copied there once, so that they time the step alone (towers splits it on the GPU).
    """
    if len(devices) != 1:
        raise ValueError(f"--resident is for one device; got {len(devices)}.")
    from towers.bench._model_rule import LEARNING_RATE
    from towers.bench._model_steps import one_device

    (device,) = devices
    with tf.device(device):
        resident = tf.nest.map_structure(tf.identity, next(iter(dataset)))
    guards = {"towers replicated xla": "default", "towers replicated xla, no guard": None}
    rows = {}
    if "one device xla" in chosen:

        def floor():
            step = one_device(make_model, mean_loss, device, jit_compile=True)
            return lambda data: step(resident)

        rows["one device xla, resident input"] = floor
    for label, nonfinite in guards.items():
        if label not in chosen:
            continue

        def towers_row(nonfinite=nonfinite):
            model = towers.Replicated(make_model, devices)
            optimizer = towers.SGD(LEARNING_RATE)

            @tf.function
            def step():
                return towers.train_step(
                    lambda shard: mean_loss(model.local(), shard),
                    model,
                    optimizer,
                    resident,
                    devices,
                    split_device=device,
                    nonfinite=nonfinite,
                    jit_compile=True,
                )[0]

            return lambda data: step()

        rows[f"{label}, resident input"] = towers_row
    return rows


def _staged_after(config):
    """`config` (staged input), its next batch staged once the step's programs are queued.

    As built, the step's programs and the staging of the next batch (whose copy to a GPU
    waits for all the work already queued there) wait for the same reads, and race. Here the
    staging waits for an int32 made on each device after that device's updates (at K = 1 the
    one program; otherwise each device's update), done (on a GPU) once their kernels are
    queued: each copy follows its device's programs (never beside them), and the step's
    time no longer depends on which came first. An int32 on a GPU is kept in its host
    memory, so it reaches the host without a copy; the staging reads it as data (a `tf.cond`
    on it). A control edge from a GPU op crosses to the host as an empty copy that waits for
    the GPU to have run everything queued: until 6abeaef the staging waited on one from the
    program's output, and from 6abeaef to session 41's review on int32 identities used only
    as control inputs, which grappler's dependency optimizer turns into the same (the fetch,
    the host copy and the transfer then all came after the program's end).
    """
    from towers.data._staged import StagedInput
    from towers.ops.internal import update_ops
    from towers.step import _train_step

    deferred = []
    real_shards, real_step = _train_step._shards, _train_step.one_program_step
    real_updates = _train_step.reduced_updates

    def shards(inputs, devices, split_device):
        if not isinstance(inputs, StagedInput):
            return real_shards(inputs, devices, split_device)
        stage = inputs._stage_next
        inputs._stage_next = tf.no_op  # (take's staging: built after the programs instead)
        try:
            taken, sizes = inputs.take()
        finally:
            del inputs._stage_next  # (the method again)
        staging: list = []
        deferred.append((stage, staging, inputs))
        return taken, sizes, staging

    def staged_after(updates):
        if not deferred:
            return
        stage, staging, inputs = deferred.pop()
        ops = update_ops(updates)
        with tf.device("/device:CPU:0"):
            token = tf.cast(inputs._ready.read_value(), tf.int32)  # (0 or 1: not a constant)
        gates = []
        for device in sorted({op.device for op in ops}):
            with (
                tf.device(device),
                tf.control_dependencies([op for op in ops if op.device == device]),
            ):
                gates.append(tf.identity(token))  # (int32: host memory on a GPU)
        with tf.device("/device:CPU:0"):  # (read as data: see the docstring)
            queued = gates[0] >= 0
            for gate in gates[1:]:
                queued = tf.logical_and(queued, gate >= 0)
            staging.append(tf.cond(queued, stage, lambda: tf.constant(False)))

    def one_program_step(*args, **kwargs):
        loss, outputs, updates, verdict = real_step(*args, **kwargs)
        staged_after(updates)
        return loss, outputs, updates, verdict

    def reduced_updates(*args, **kwargs):
        updates, verdict = real_updates(*args, **kwargs)
        staged_after(updates)
        return updates, verdict

    return _patched(
        config,
        [
            (_train_step, "_shards", shards),
            (_train_step, "one_program_step", one_program_step),
            (_train_step, "reduced_updates", reduced_updates),
        ],
    )


def _timestamped_allocator() -> None:
    """Gives this process's GPUs TensorFlow's timestamped allocator; before they start.

    A copy from the host to a GPU waits for everything the GPU's compute stream holds when
    the copy is queued (`sync_dst_compute`), so that its buffer is free of the kernels queued
    before it. With the timestamped allocator, the copy's buffer is only memory whose last
    kernels have run, and the copy waits for nothing queued on the device
    (`SameWorkerRecvDone`: `sync_dst_compute` is off where the device's `SafeAllocFrontier`
    is nonzero). A staged batch's copy can then overlap the program queued before it.
    TensorFlow 2 has no public switch for it (`GPUOptions.experimental`): the eager
    context's base `ConfigProto` is set here, as `tf.compat.v1.ConfigProto` would in a
    session.
    """
    from tensorflow.core.protobuf import config_pb2
    from tensorflow.python.eager import context

    config = config_pb2.ConfigProto()
    config.gpu_options.experimental.timestamped_allocator = True
    context.context()._config = config
    print("the timestamped GPU allocator: on", flush=True)


def _copy_first(config):
    """`config` (one device, one program), its program queued after the next batch's copy.

    The copy of the next batch to the GPU waits for the work already queued there when it is
    queued itself. Here the next batch is fetched unconditionally (the suite's data repeats)
    and the program waits for an int32 from its first element, received in the GPU's host
    memory (a control edge's empty float would be received through the copy stream, after
    the copy). Whether the copy is then queued first is a race: the shard's send copies a
    pageable batch into a pinned buffer on its thread before it queues the copy (TensorFlow's
    `GPUUtil::CopyCPUTensorToGPU`), while the gate's ops run on others. The trace shows which.
    (Session 41's review: the gate on the GPU is used only as a control input, which
    grappler's dependency optimizer turns into a control edge from the host, an empty copy
    through the host-to-device stream, queued behind the batch's own copy there. So session
    40's result, the program waiting for the copy, may be this gate's doing.)
    """
    from towers.data._staged import StagedInput
    from towers.step import _train_step

    gates, real_shards, real_step = [], _train_step._shards, _train_step.one_program_step

    def shards(inputs, devices, split_device):
        if not isinstance(inputs, StagedInput):
            return real_shards(inputs, devices, split_device)

        def stage_next():
            with tf.device("/device:CPU:0"):
                leaves = tf.nest.flatten(inputs.iterator.get_next())
                first = tf.reshape(leaves[0], [-1])[0]
                gates.append(tf.abs(tf.cast(first, tf.int32)))
                return inputs._put(leaves)

        inputs._stage_next = stage_next
        try:
            return real_shards(inputs, devices, split_device)
        finally:
            del inputs._stage_next  # (the method again)

    def one_program_step(*args, **kwargs):
        device = args[5]  # (loss_fn, variables, optimizer, shard, size, device)
        with tf.device(device):  # an int32 on a GPU is in its host memory: no stream to wait on
            gate = [tf.identity(g) for g in gates[-1:]]
        with tf.control_dependencies(gate):
            result = real_step(*args, **kwargs)
        del gates[:]
        return result

    return _patched(
        config,
        [
            (_train_step, "_shards", shards),
            (_train_step, "one_program_step", one_program_step),
        ],
    )


def _pinned(config):
    """`config` (staged input), each shard it stages copied to a fresh host tensor first.

    A CPU op's own output that feeds a copy to a GPU is allocated in pinned memory
    (`InferAllocAttr` in TensorFlow's executor); the staged batch, the dataset's tensor or a
    slice of it, is not: `GPUUtil::CopyCPUTensorToGPU` then copies it into a pinned buffer
    first, on the thread that completes the transfer, or (memory of unknown type) leaves it
    to the driver's pageable copy, which waits for the program the copy waits for. Here a
    `DeepCopy` on the host makes each shard, so the transfer is a DMA alone. The race with
    the program stays. (Since 5f0d874 `towers.data._transfer.sent` does this for every
    shard bound for a GPU: this row adds a second copy; `--pageable` is the old copy.)
    """
    real_split = towers.ops.split_batch

    def split_batch(inputs, num_splits, *, device="/cpu:0"):
        shards = real_split(inputs, num_splits, device=device)
        with tf.device(device):
            return [
                tf.nest.map_structure(lambda t: tf.raw_ops.DeepCopy(x=t), shard) for shard in shards
            ]

    return _patched(config, [(towers.ops, "split_batch", split_batch)])


def _pageable(config):
    """`config` (staged input), each shard it stages sent as the split made it.

    As staged until wave 5, session 40: the dataset's batch, or a slice of it, pageable host
    memory, which the driver copies to the GPU synchronously (`towers.data._transfer.sent`).
    """
    from towers.data import _staged

    return _patched(config, [(_staged, "sent", lambda leaf, split_device, device: leaf)])


def _split_mb(devices: int) -> int:
    """.ci/gpu/models.sh's split: 100000 or 2 x 60000 MiB on an H200, 70000 or 2 x 36000 below."""
    import subprocess

    query = ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"]
    total = int(subprocess.run(query, capture_output=True, text=True).stdout.split()[0])
    if total >= 100000:
        return 100000 if devices == 1 else 60000
    return 70000 if devices == 1 else 36000


def _read(path: str) -> tuple[list, list, list]:
    """A trace's GPU events, host events and step marks: (start_ns, end_ns, plane, line, name)."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    with open(path, "rb") as f:
        space.ParseFromString(f.read())
    events, host, marks = [], [], []
    for plane in space.planes:
        names = {k: v.name for k, v in plane.event_metadata.items()}
        on_gpu = plane.name.startswith("/device:GPU")
        if not on_gpu and not plane.name.startswith("/host:CPU"):
            continue
        for line in plane.lines:
            if on_gpu and line.name in ("XLA Ops", "XLA Modules", "Steps", "TensorFlow Ops"):
                continue
            base = line.timestamp_ns
            for e in line.events:
                start = base + e.offset_ps // 1000
                name = names.get(e.metadata_id, "?")
                row = (start, start + e.duration_ps // 1000, plane.name[-5:], line.name, name)
                if on_gpu:
                    events.append(row)
                elif name == "towers_step":
                    marks.append(row)
                else:
                    host.append(row)
    return sorted(events), sorted(host), sorted(marks)


def summarize(path: str, steps: int) -> None:
    """Prints each GPU stream's busy time; the slowest step's idle gaps and timeline."""
    events, every, marks = _read(path)
    host = [h for h in every if re.search(_HOST, h[4])]
    print(f"step marks: {[round((m[1] - m[0]) / 1e6, 2) for m in marks]} ms")
    if marks:  # (the slowest traced step: where a row's slow steps go)
        begin, finish = max(marks, key=lambda m: m[1] - m[0])[:2]
        print("  host ops of the slowest step (start ms, us, thread, name):")
        shown = [h for h in host if begin <= h[0] <= finish and h[1] - h[0] > 10_000]
        for start, end, _, line, name in shown[:80]:
            at, took = (start - begin) / 1e6, (end - start) / 1e3
            print(f"    {at:8.2f} {took:7.0f} {line[:18]:18s} {name[:70]}")
        _threads([h for h in every if begin <= h[0] <= finish], begin)
    if not events:
        print("no GPU events")
        return
    busy = collections.Counter()
    for start, end, plane, line, _ in events:
        busy[(plane, line)] += end - start
    for key, ns in sorted(busy.items()):
        print(f"  busy {key[0]} {key[1][:40]:40s} {ns / 1e6 / steps:8.3f} ms/step")
    by_name = collections.Counter()
    for start, end, plane, _, name in events:
        by_name[(plane, _kind(name))] += end - start
    for (plane, kind), ns in by_name.most_common(14):
        print(f"    {plane} {kind[:70]:70s} {ns / 1e6 / steps:8.3f} ms/step")
    if not marks:
        return
    last = [e for e in events if begin <= e[0] <= finish + 5_000_000]
    gaps, reach = [], begin
    for event in last:
        if event[0] - reach > 50_000:
            gaps.append((reach - begin, event[0] - reach))
        reach = max(reach, event[1])
    print(
        f"  slowest step: host {(finish - begin) / 1e6:.2f} ms; GPU from "
        f"{(last[0][0] - begin) / 1e6:.2f} to {(reach - begin) / 1e6:.2f} ms; idle gaps "
        f"(at ms, us): {[(round(a / 1e6, 2), round(g / 1e3)) for a, g in gaps][:30]}"
    )
    segments = {}
    for start, end, plane, line, name in last:
        key = (plane, line)
        seg = segments.get(key)
        if seg and start - seg[-1][1] < 30_000:
            seg[-1][1] = max(seg[-1][1], end)
            seg[-1][3] += 1
        else:
            segments.setdefault(key, []).append([start, end, name, 1])
    print("  segments of the slowest step (stream: start-end ms, kernels, first):")
    for key, segs in sorted(segments.items()):
        shown = [s for s in segs if s[1] - s[0] >= 20_000 or len(segs) < 12]
        text = "; ".join(
            f"{(a - begin) / 1e6:.2f}-{(b - begin) / 1e6:.2f} x{n} {first[:28]}"
            for a, b, first, n in shown[:14]
        )
        print(f"    {key[0]} {key[1][:24]}: {text}")


def _threads(step: list, begin: int) -> None:
    """Each host thread's events in a step (all of them, the program's launches included).

    Where a slow step's time goes on the host: a thread that queues the program's kernels
    late (it starts after the next batch's host copy), or slowly (its events stretch over
    the copy), and the step's longest host events whatever their names.
    """
    by_line: dict = collections.defaultdict(list)
    for event in step:
        by_line[event[3]].append(event)
    print("  host threads of the slowest step (first-last ms, events, busy ms):")
    for line, rows in sorted(by_line.items(), key=lambda item: item[1][0][0]):
        if len(rows) >= 20 or any(e[1] - e[0] > 1_000_000 for e in rows):
            first, last = (rows[0][0] - begin) / 1e6, (max(e[1] for e in rows) - begin) / 1e6
            busy, reach = 0, rows[0][0]  # (the union of its events: nested ones once)
            for start, end, *_ in rows:
                busy += max(0, end - max(start, reach))
                reach = max(reach, end)
            busy /= 1e6
            print(f"    {line[:24]:24s} {first:7.2f}-{last:7.2f} x{len(rows):<5d} {busy:7.2f}")
    inner = [e for e in step if not e[3].startswith("python")]  # (not the call's wrappers)
    longest = sorted(inner, key=lambda e: e[0] - e[1])[:12]
    print("  its longest host events off the calling thread (start ms, us, thread, name):")
    for start, end, _, line, name in sorted(longest):
        at, took = (start - begin) / 1e6, (end - start) / 1e3
        print(f"    {at:8.2f} {took:7.0f} {line[:18]:18s} {name[:70]}")


_HOST = "|".join(
    ("XlaRun", "XlaLaunch", "_XlaCompile", "PartitionedCall", "_Send", "_Recv", "Assert")
    + ("DeepCopy", "AssignVariableOp")
    + ("Iterator", "EagerExecute", "Wait", "Memcpy")
)


def tail(path: str, ms: float) -> None:
    """Prints every GPU event, and every host event over 3 us, of the last step's last `ms`."""
    events, host, marks = _read(path)
    if not marks:
        return
    begin, finish = marks[-1][:2]
    rows = [("G", *e) for e in events] + [("H", *h) for h in host if h[1] - h[0] > 3000]
    print(f"  the last {ms} ms of the last step (ms from its start, us, where, name):")
    for kind, start, end, _, line, name in sorted(rows, key=lambda r: r[1]):
        if end >= finish - ms * 1e6 and start <= finish:
            at, took = (start - begin) / 1e6, (end - start) / 1e3
            print(f"    {kind} {at:8.3f} {took:7.1f} {line[:14]:14s} {name[:80]}")


def _kind(name: str) -> str:
    """A kernel's family: its name without numbers."""
    return re.sub(r"[0-9]+", "N", name)


if __name__ == "__main__":
    main()
