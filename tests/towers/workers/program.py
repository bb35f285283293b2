"""A worker of the multi-worker tests: run by `cluster_test.py`, one process per worker.

Usage: TF_CONFIG=... python -m tests.towers.workers.program MODE OUT [SIZES]
MODE:
- "train": 10 steps on this worker's part of each global batch; the chief saves the weights
  to OUT (with WORKER_SHARDED=1, the optimizer state sharded over every worker's towers;
  with WORKER_POISON_STEP=n, worker 1's embedding gradient is NaN at step n (one owner's
  share: the other workers' are finite), a step every worker skips).
- "retrace": the same, worker 1's batches 2 smaller from step 5.
- "v1": "train" in a v1 graph and session; a CheckpointManager saves to the directory OUT
  (with WORKER_SHARDED=1, sharded state and the optimizer's state with the weights).
- "batch_norm": 3 steps of a synchronized BatchNorm model; the chief saves the weights.
- "checkpoint": 5 steps, then a CheckpointManager in the directory OUT (every worker saves
  with it; with WORKER_SHARDED=1 the chief's file gathers the state other workers keep),
  with a GradientAccumulator whose sums each worker fills with its index + 1.
- "resume": restores the newest checkpoint of the directory OUT, trains to step 10, and the
  chief saves the weights to OUT.final.npz.
- "kill" / "stop" / "v1kill": worker 1 kills or freezes itself after one step (of a v1
  session for "v1kill"); the others report the error they get and how long after the fault
  it came, to OUT.<index>.json.
- "jobs": OUT is a JSON file listing jobs (`Job`'s fields), run one after the other in this
  one process: a cluster that several tests share (each process costs seconds to start).
  A failing job reports to its OUT.<index>.json and ends the process. When every worker
  finished a job, the chief writes OUT.done (the job's OUT): a job of another cluster with
  `after` set to that OUT waits for it (e.g. "resume" for the checkpoint another wrote).

The options of one mode come from the environment (WORKER_LOCAL_FIRST, WORKER_SHARDED,
WORKER_POISON_STEP); a job names its own.
"""

import dataclasses
import itertools
import json
import os
import signal
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ["TOWERS_TEST_DEVICES"] = os.environ.get("WORKER_DEVICES", "2")  # towers per worker

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import towers  # noqa: E402
from tests import test_util  # noqa: E402  (splits the CPU, before the runtime starts)
from tests.towers.workers.jobs import Job  # noqa: E402

# A short heartbeat for the fault tests (the bound they check); a long one otherwise, so
# that a worker starved of CPU on a loaded 2-core machine is not declared dead.
INFO = towers.init_workers(
    heartbeat_seconds=3.0 if sys.argv[1] in ("kill", "stop", "v1kill") else 30.0
)


def _build():
    model = test_util.Model(seed=INFO.index)  # other values than the chief's: broadcast them
    model(test_util.batch(1)[0])
    return model


def _my_part(batch, sizes):
    first = sum(sizes[: INFO.index])
    mine = slice(first, first + sizes[INFO.index])
    return tf.nest.map_structure(lambda t: t[mine], batch)


def step_sizes(mode, sizes, i):
    """Each worker's batch size at step i: in "retrace" mode, worker 1's shrinks at step 5,
    so that it alone traces its step again."""
    if mode == "retrace" and i >= 5:
        return [n - 2 if w == 1 else n for w, n in enumerate(sizes)]
    return sizes


def main_v1(job, steps=10, kill=False):
    """The "train" mode in a v1 graph, run by a session on this worker's server; with
    `kill`, worker 1 kills itself after one step (as the "kill" mode)."""
    out, sizes, sharded = job.out, job.sizes, job.sharded
    devices = towers.list_devices()
    made = [_my_part(test_util.batch(sum(sizes), seed=i), sizes) for i in range(min(steps, 10))]
    batches = itertools.islice(itertools.cycle(made), steps)  # ("v1kill": 10, again and again)
    first = made[0]
    with tf.Graph().as_default():
        replicas = towers.Replicated(_build, devices, shard_optimizer_state=sharded)
        broadcast = replicas.broadcast()
        optimizer = towers.SGD(0.1, momentum=0.9)
        feeds = tf.nest.map_structure(
            lambda t: tf.compat.v1.placeholder(t.dtype, [None, *t.shape[1:]]), first
        )
        loss, _ = towers.train_step(
            lambda b: test_util.loss_fn(replicas.local())(b),
            replicas,
            optimizer,
            feeds,
            devices,
        )
        with tf.compat.v1.Session(INFO.target, config=towers.session_config()) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(broadcast)
            for i, batch in enumerate(batches):
                flat = [t.numpy() for t in tf.nest.flatten(batch)]
                sess.run(loss, dict(zip(tf.nest.flatten(feeds), flat)))
                if kill and i == 0 and INFO.index == 1:
                    _fault(out, signal.SIGKILL)
            saved = optimizer if sharded else None  # sharded: the state, gathered to the chief
            with towers.CheckpointManager(out, replicas, saved, session=sess) as manager:
                written = manager.save(steps)  # every worker calls it; the chief alone writes
            assert bool(written) == INFO.is_chief, written
    towers.barrier(job.name)


def main_batch_norm(job, steps=3):
    """A synchronized BatchNorm whose statistics span every worker's towers."""
    from tests.towers.layers import batch_norm_test  # noqa: PLC0415

    out, sizes = job.out, job.sizes
    devices = towers.list_devices()
    replicas = towers.Replicated(
        lambda: batch_norm_test._built(batch_norm_test.Net(True, seed=INFO.index)), devices
    )
    optimizer = towers.SGD(batch_norm_test.LR)
    step = tf.function(
        lambda b: towers.train_step(
            lambda s: batch_norm_test._loss(replicas.local())(s), replicas, optimizer, b, devices
        )
    )
    for i in range(steps):
        step(_my_part(batch_norm_test._batch(sum(sizes), seed=i), sizes))
    if INFO.is_chief:
        towers.save_weights(replicas, out)
    towers.barrier(job.name)


def _fault(out, signum):
    """Writes the time of the fault to OUT.fault, then kills or freezes this process."""
    with open(f"{out}.fault", "w") as f:
        f.write(str(time.time()))
    os.kill(os.getpid(), signum)


def main(job):
    """Runs one job (see the module's docstring for the modes)."""
    mode, out, sizes = job.mode, job.out, job.sizes
    if mode in ("v1", "v1kill"):
        return main_v1(job, steps=10 if mode == "v1" else 1000, kill=mode == "v1kill")
    if mode == "batch_norm":
        return main_batch_norm(job)
    devices = towers.list_devices()
    all_reduce = towers.WorkersAllReduce(local_first=job.local_first)
    replicas = towers.Replicated(
        _build, devices, all_reduce=all_reduce, shard_optimizer_state=job.sharded
    )
    optimizer = towers.SGD(0.1, momentum=0.9)
    poison = job.poison

    @tf.function
    def step(batch, poisoned):
        def loss_fn(b):  # poisoned: the embedding's gradient alone NaN (one owner's share)
            loss, logits = test_util.loss_fn(replicas.local())(b)
            nan = tf.where(poisoned, np.nan, 0.0) * tf.reduce_sum(replicas.local().embedding)
            return loss + nan, logits

        return towers.train_step(
            loss_fn,
            replicas,
            optimizer,
            batch,
            devices,
            nonfinite="skip" if poison >= 0 else "raise",
        )[0]

    steps = {"train": 10, "retrace": 10, "checkpoint": 5, "resume": 10}.get(mode, 1000)
    traced, start = 0, 0
    sums = {"sums": towers.GradientAccumulator(every=2)}  # (checkpointed, never accumulating)
    if mode == "resume":
        with towers.CheckpointManager(out, replicas, optimizer, extra=sums) as manager:
            start = manager.restore_latest()
        assert start == 5, start
    for i in range(start, steps):
        now = step_sizes(mode, sizes, i)
        if i == 5:
            traced = step.experimental_get_tracing_count()
        poisoned = tf.constant(i == poison and INFO.index == 1)
        step(_my_part(test_util.batch(sum(now), seed=i), now), poisoned)
        if mode in ("kill", "stop") and i == 0 and INFO.index == 1:
            _fault(out, signal.SIGKILL if mode == "kill" else signal.SIGSTOP)
    towers.check_replicas_identical(replicas)
    if mode == "checkpoint":  # every worker calls it; the chief alone writes
        with towers.CheckpointManager(out, replicas, optimizer, extra=sums) as manager:
            for name, group in sums["sums"].variable_copies().items():  # this worker's sums
                for var in group if name.startswith("sums/") else ():
                    var.assign(tf.fill(var.shape, tf.cast(INFO.index + 1, var.dtype)))
            written = manager.save(steps)
        assert bool(written) == INFO.is_chief, written
    elif INFO.is_chief:
        towers.save_weights(replicas, f"{out}.final.npz" if mode == "resume" else out)
    if mode == "retrace":  # from step 5 on, worker 1 traced once more, the others did not
        more = step.experimental_get_tracing_count() - traced
        assert more == (1 if INFO.index == 1 else 0), more
    towers.barrier(job.name)


def _job_from_environment(mode, out, sizes):
    return Job(
        mode,
        out,
        tuple(sizes),
        local_first=os.environ.get("WORKER_LOCAL_FIRST", "1") == "1",
        sharded=os.environ.get("WORKER_SHARDED", "0") == "1",
        poison=int(os.environ.get("WORKER_POISON_STEP", "-1")),
    )


def _wait_for(out, timeout=300):
    """Waits until the job of another cluster that wrote `out` ended (its OUT.done)."""
    deadline = time.monotonic() + timeout
    while not os.path.exists(f"{out}.done"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{out}.done did not come in {timeout} s")
        time.sleep(0.1)


def _run(job):
    try:
        if job.after:
            _wait_for(job.after)
        main(job)
    except Exception as error:  # noqa: BLE001  (reported to the test, then a non-zero exit)
        with open(f"{job.out}.{INFO.index}.json", "w") as f:
            json.dump(
                {"error": type(error).__name__, "at": time.time(), "why": str(error)[:300]}, f
            )
        raise


if __name__ == "__main__":
    mode, out = sys.argv[1], sys.argv[2]
    if mode == "jobs":
        with open(out) as f:
            jobs = [Job(**fields) for fields in json.load(f)]
        for i, job in enumerate(jobs):
            _run(dataclasses.replace(job, sizes=tuple(job.sizes), name=f"end-{i}"))
            if INFO.is_chief:  # after the job's closing barrier: every worker is done
                with open(f"{job.out}.done", "w"):
                    pass
            print(f"done {job.mode} {job.out}", flush=True)
    else:
        sizes = (
            [int(s) for s in sys.argv[3].split(",")]
            if len(sys.argv) > 3
            else [6] * INFO.num_workers
        )
        _run(_job_from_environment(mode, out, sizes))
