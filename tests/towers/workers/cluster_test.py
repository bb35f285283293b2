"""Several workers on TensorFlow's collective runtime: each a subprocess on loopback."""

import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time
from unittest import mock

import numpy as np
import tensorflow as tf
from absl.testing import parameterized

import towers
from tests import forked, test_util
from tests.towers.workers.jobs import Job
from towers.variables import _parameter_server
from towers.workers import launch

# What a survivor may see: the peer's connection reset, or the coordination service's verdict.
ERRORS = ("UnavailableError", "AbortedError", "DeadlineExceededError", "CancelledError")
ROOT = test_util.ROOT


def _start_workers(n, *args, devices=2, local_first=True, sharded=False, poison=None):
    """Starts `n` workers (`tests.towers.workers.program`) with their TF_CONFIG; the processes."""
    return _start(n, args, devices, local_first, sharded, poison)


def _start_jobs(n, jobs, path, devices):
    """Starts `n` workers that run `jobs` (`Job`s) one after the other."""
    with open(path, "w") as f:
        json.dump([dataclasses.asdict(job) for job in jobs], f)
    return _start(n, ("jobs", path), devices, True, False, False)


def _start(n, args, devices, local_first, sharded, poison):
    cluster = [f"127.0.0.1:{p}" for p in launch.free_ports(n)]
    processes = []
    for i in range(n):
        config = {"cluster": {"worker": cluster}, "task": {"type": "worker", "index": i}}
        poisoned = sharded if poison is None else poison
        env = test_util.child_env(
            TF_CONFIG=json.dumps(config),
            WORKER_DEVICES=str(devices),
            WORKER_LOCAL_FIRST=str(int(local_first)),
            WORKER_SHARDED=str(int(sharded)),
            WORKER_POISON_STEP=str(POISONED if poisoned else -1),
        )
        processes.append(
            forked.Popen(
                [sys.executable, "-m", "tests.towers.workers.program", *args],
                env=env,
                stdout=forked.PIPE,
                stderr=forked.STDOUT,
                text=True,
            )
        )
    return processes


def _wait(processes, timeout=120):
    """Every process's (exit code, output); kills what is left after `timeout` seconds."""
    deadline, results = time.monotonic() + timeout, []
    for process in processes:
        try:
            output, _ = process.communicate(timeout=max(deadline - time.monotonic(), 1))
        except forked.TimeoutExpired:
            process.kill()
            output, _ = process.communicate()
        results.append((process.returncode, output))
    return results


POISONED = 3  # the step worker 1's loss is NaN in the sharded runs: every worker skips it


def _reference(sizes, steps=10, mode="train", skipped=()):
    """One process, one device, the concatenated batch: the weights the workers must reach."""
    model = test_util.built_model()
    step = test_util.reference_step(model, test_util.loss_fn(model), 0.1, momentum=0.9)
    for i in range(steps):
        if i not in skipped:
            step(test_util.batch(sum(workers_program_sizes(mode, sizes, i)), seed=i))
    return towers.named_variables(model)


def workers_program_sizes(mode, sizes, i):
    """The workers' batch sizes at step i (as `program.step_sizes`)."""
    if mode == "retrace" and i >= 5:
        return [n - 2 if w == 1 else n for w, n in enumerate(sizes)]
    return sizes


def _assert_trained(saved, sizes, sharded):
    """The weights the workers saved are those of one process on the concatenated batches."""
    skipped = (POISONED,) if sharded else ()  # (worker 1's NaN step, see `program.py`)
    for name, var in _reference(sizes, skipped=skipped).items():
        test_util.assert_allclose(saved[name], var, rtol=1e-6, atol=1e-6)


def _shared_jobs(directory):
    """The runs several tests share, by towers per worker: {devices: [Job]}. Each group is
    one cluster of 2 workers that runs its jobs one after the other (eager ones first)."""
    at = lambda name: os.path.join(directory, name)  # noqa: E731
    return {
        2: [
            Job("train", at("train-6-6.npz"), (6, 6)),
            Job("train", at("train-5-8.npz"), (5, 8), local_first=False, sharded=True,
                poison=POISONED),
            Job("retrace", at("retraced.npz"), (5, 6)),
            Job("batch_norm", at("bn-2.npz"), (5, 6)),
            Job("checkpoint", at("run"), (5, 6), sharded=True),
            Job("v1", at("v1-0"), (5, 6)),
            Job("v1", at("v1-1"), (5, 6), sharded=True),
        ],
        1: [
            Job("train", at("one.npz"), (5, 6)),
            Job("batch_norm", at("bn-1.npz"), (5, 6)),
            Job("resume", at("run"), (5, 6), sharded=True, after=at("run")),  # 2 devices' "run"
        ],
    }  # fmt: skip


class TrainTest(tf.test.TestCase, parameterized.TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.shared = tempfile.mkdtemp(prefix="cluster_test.")
        groups = _shared_jobs(cls.shared)
        started = {
            devices: _start_jobs(2, jobs, os.path.join(cls.shared, f"jobs-{devices}"), devices)
            for devices, jobs in groups.items()
        }
        cls.outputs = {}
        for devices, processes in started.items():
            results = _wait(processes, timeout=400)
            for job in groups[devices]:
                cls.outputs[job.mode, job.out] = (job, results)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.shared, ignore_errors=True)
        super().tearDownClass()

    def _shared_run(self, name, mode=None):
        """The path job `name` (of `mode`, where two share it) of `_shared_jobs` wrote, once
        both of its workers finished it."""
        path = os.path.join(self.shared, name)
        ((job, results),) = [
            found for (m, out), found in self.outputs.items() if out == path and mode in (None, m)
        ]
        for code, output in results:
            self.assertIn(f"done {job.mode} {job.out}", output, f"exit {code}: {output[-3000:]}")
        return job.out

    @parameterized.parameters(([6, 6], False), ([5, 8], True))
    def test_workers_train_like_one_process_on_the_whole_batch(self, sizes, sharded):
        """Hierarchical (6, 6: each worker sums its towers first) or flat (5, 8: one group of
        all); the optimizer state whole on every tower, or sharded over every worker's towers
        (then worker 1's NaN at step 3 is skipped by every worker, whose shares it does not
        hold). 3 workers: `OwnClusterTest`."""
        saved = towers.read_weights(self._shared_run(f"train-{sizes[0]}-{sizes[1]}.npz"))
        _assert_trained(saved, sizes, sharded)

    def test_one_device_per_worker(self):
        """The usual cluster: one GPU per host. The all-reduce still spans the workers."""
        _assert_trained(towers.read_weights(self._shared_run("one.npz")), [5, 6], sharded=False)

    @parameterized.parameters(False, True)
    def test_v1_graphs_and_sessions(self, sharded):
        """Each worker builds a v1 graph and runs it in a session on its own server (sharded:
        the chief's checkpoint gathers the state the other worker keeps, in the session)."""
        directory = self._shared_run(f"v1-{int(sharded)}")
        model = test_util.built_model()
        optimizer = towers.SGD(0.1, momentum=0.9) if sharded else None
        with towers.CheckpointManager(directory, model, optimizer) as manager:
            self.assertEqual(manager.restore_latest(), 10)  # strict: every slot in the file
        want = _reference([5, 6])
        for name, var in want.items():
            test_util.assert_allclose(
                towers.named_variables(model)[name], var, rtol=1e-5, atol=1e-6
            )
        if sharded:  # the momentum of step 10: (w9 - w10) / learning rate
            before = {n: v.numpy() for n, v in _reference([5, 6], steps=9).items()}
            slots = towers.named_variables(optimizer)
            for name, var in want.items():
                momentum = (before[name] - var.numpy()) / 0.1
                test_util.assert_allclose(
                    slots[f"slots/{name}/momentum"], momentum, rtol=1e-3, atol=1e-5
                )

    @parameterized.parameters(1, 2)
    def test_a_synchronized_batch_norm_spans_the_workers(self, devices):
        """Statistics of the global batch, as one device's BatchNorm on the whole of it."""
        from tests.towers.layers import batch_norm_test  # noqa: PLC0415

        path = self._shared_run(f"bn-{devices}.npz")
        reference = batch_norm_test.Reference()
        for i in range(3):
            reference.step(batch_norm_test._batch(11, seed=i))
        saved = towers.read_weights(path)
        self.assertEqual(sorted(saved), sorted(reference.named()))
        for name, var in reference.named().items():
            test_util.assert_allclose(saved[name], var, rtol=1e-6, atol=1e-6)

    def test_a_worker_retracing_alone_keeps_working(self):
        """Worker 1's batches shrink at step 5: it traces again, the others do not."""
        saved = towers.read_weights(self._shared_run("retraced.npz"))
        for name, var in _reference([5, 6], mode="retrace").items():
            test_util.assert_allclose(saved[name], var, rtol=1e-6, atol=1e-6)

    def test_the_chiefs_checkpoint_resumes_in_one_process(self):
        """With the state sharded across workers, the chief's file holds every worker's: one
        process (3 towers, unsharded) resumes from it, and so do 2 workers of 1 device (the
        shared cluster of 1 device, once the other wrote it)."""
        directory = self._shared_run("run", "checkpoint")
        self.assertEqual(sorted(os.listdir(directory)).count("checkpoints.json"), 1)
        devices = test_util.devices(3)
        replicas = towers.Replicated(test_util.built_model, devices)
        optimizer = towers.SGD(0.1, momentum=0.9)
        sums = towers.GradientAccumulator(every=2)
        extra = {"sums": sums}
        with towers.CheckpointManager(directory, replicas, optimizer, extra=extra) as manager:
            self.assertEqual(manager.restore_latest(), 5)  # strict: every slot and sum there
        trained = replicas.variables_of(0)  # their owners at 2 workers x 2 devices, as saved
        owners = towers.ops.internal.owners_by_bytes(trained, 4)
        worker = {var.ref(): owner // 2 for var, owner in zip(trained, owners)}
        restored = sums.variable_copies()
        for name, var in towers.named_variables(replicas).items():
            want = worker.get(var.ref(), 0) + 1  # what the owner's worker wrote in its sums
            got = restored[f"sums/{name}"][0]
            np.testing.assert_array_equal(got, np.full(var.shape, want, var.dtype.as_numpy_dtype))
        self.assertIn(1, worker.values())  # worker 1 owns some: their sums were gathered

        @tf.function
        def step(batch):
            loss_fn = lambda b: test_util.loss_fn(replicas.local())(b)  # noqa: E731
            return towers.train_step(loss_fn, replicas, optimizer, batch, devices)[0]

        for i in range(5, 10):
            step(test_util.batch(11, seed=i))
        want = _reference([5, 6])
        for name, var in towers.named_variables(replicas).items():
            test_util.assert_allclose(var, want[name], rtol=1e-5, atol=1e-6)
        saved = towers.read_weights(f"{self._shared_run('run', 'resume')}.final.npz")
        for name, var in want.items():
            test_util.assert_allclose(saved[name], var, rtol=1e-5, atol=1e-6)


class OwnClusterTest(tf.test.TestCase):
    """Clusters of their own (a size or a start of their own), beside `TrainTest`'s."""

    def test_the_launcher_runs_three_workers_that_train_like_one_process(self):
        """As `TrainTest`'s, with 3 workers `towers.launch` starts: hierarchical sums, the
        state sharded over 6 towers. (One cluster for both: 3 processes, not 5.)"""
        path = os.path.join(self.get_temp_dir(), "launched.npz")
        script = os.path.join(ROOT, "tests", "towers", "workers", "program.py")
        env = test_util.child_env(
            WORKER_DEVICES="2",
            WORKER_LOCAL_FIRST="1",
            WORKER_SHARDED="1",
            WORKER_POISON_STEP=str(POISONED),  # sharded state's NaN step (see `_start`)
        )
        code = launch.launch([script, "train", path, "4,3,6"], 3, timeout_seconds=120, env=env)
        self.assertEqual(code, 0)
        _assert_trained(towers.read_weights(path), [4, 3, 6], sharded=True)


class AloneTest(tf.test.TestCase):
    def test_without_tf_config_one_worker_alone(self):
        self.assertEqual(towers.init_workers(), towers.WorkerInfo(0, 1, "localhost"))
        self.assertTrue(towers.current_workers().is_chief)
        towers.barrier("nothing to wait for")

    def test_the_private_start_up_calls_still_exist(self):
        """init_workers uses calls TensorFlow does not export: a new version must keep them."""
        from tensorflow.core.protobuf import tensorflow_server_pb2
        from tensorflow.python.eager import context

        for name in (
            "configure_collective_ops",
            "configure_coordination_service",
            "enable_collective_ops",
            "ensure_initialized",
            "wait_at_barrier",
        ):
            self.assertTrue(callable(getattr(context.Context, name, None)), name)
        self.assertTrue(hasattr(context.context(), "_initialized"))
        fields = tensorflow_server_pb2.ServerDef.DESCRIPTOR.fields_by_name
        for field in ("cluster", "job_name", "task_index", "protocol", "port"):
            self.assertIn(field, fields)

    def test_a_bad_tf_config_is_refused_clearly(self):
        for text, message in (
            ("{", "must be JSON"),
            ('{"cluster": {"chief": ["a:1"]}, "task": {"type": "worker"}}', "must list the"),
            ('{"cluster": {"worker": ["a:1"]}, "task": {"index": 3}}', "index must be in"),
        ):
            with mock.patch.dict(os.environ, {"TF_CONFIG": text}):
                with self.assertRaisesRegex(ValueError, message):
                    towers.init_workers()

    def test_the_parameter_server_strategy_is_refused_across_workers(self):
        two = towers.WorkerInfo(0, 2, "worker")
        with mock.patch.object(_parameter_server, "current_workers", lambda: two):
            model = test_util.built_model()
            with self.assertRaisesRegex(ValueError, "Across workers use towers.Replicated"):
                towers.train_step(
                    test_util.loss_fn(model),
                    model,
                    towers.SGD(0.1),
                    test_util.batch(4),
                    test_util.devices(2),
                )


class FailureTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.parameters(("kill", 3), ("stop", 3), ("v1kill", 2))
    def test_a_dead_or_frozen_worker_is_an_error_on_the_others(self, mode, n):
        """Worker 1 is SIGKILLed or SIGSTOPped after a step (of tf.function, or of a v1
        session); the others fail in time."""
        path = os.path.join(self.get_temp_dir(), mode)
        processes = _start_workers(n, mode, path)
        others = [i for i in range(n) if i != 1]
        survivors = _wait([processes[i] for i in others], timeout=120)  # (a loaded machine)
        processes[1].kill()  # a frozen worker stays frozen
        _wait([processes[1]], timeout=10)
        if not os.path.exists(f"{path}.fault"):  # the others stopped before worker 1's fault
            self.fail(
                "\n".join(
                    f"worker {i} ({code}): {out[-1500:]}"
                    for i, (code, out) in zip(others, survivors)
                )
            )  # (once in the H200's GPU tier)
        with open(f"{path}.fault") as f:
            fault = float(f.read())
        for index, (code, output) in zip(others, survivors):
            self.assertNotEqual(code, 0, output[-2000:])
            with open(f"{path}.{index}.json") as f:
                report = json.load(f)
            self.assertIn(report["error"], ERRORS, output[-2000:])
            # The bound stated in docs/workers.md: the heartbeat (3 s here) plus its period.
            self.assertLess(report["at"] - fault, 10.0, report)


if __name__ == "__main__":
    tf.test.main()
