"""Workers meeting at start-up: a late, frozen or missing peer and a taken port are errors in
time, naming the worker or the port; nothing waits for ever (subprocesses on loopback)."""

import json
import os
import socket
import sys
import tempfile
import time
from unittest import mock

from absl import logging
from absl.testing import absltest, parameterized

from tests import forked, test_util
from towers.workers import _rendezvous, launch

# One worker: it joins with a short start-up timeout and prints what came of it. Given a
# folder, a worker that joined marks it there and stays up until every worker has (up to 60 s):
# the first to leave would close the coordination service under its peer's last call.
JOIN = """
import json, os, sys, time
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import towers
try:
    towers.init_workers(startup_timeout_seconds=float(sys.argv[1]))
except Exception as error:
    print(json.dumps({"error": type(error).__name__, "message": str(error)}), flush=True)
    sys.exit(3)
if len(sys.argv) > 2:
    config = json.loads(os.environ["TF_CONFIG"])
    open(os.path.join(sys.argv[2], str(config["task"]["index"])), "w").close()
    deadline = time.monotonic() + 60
    while len(os.listdir(sys.argv[2])) < len(config["cluster"]["worker"]):
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)
print(json.dumps({"error": None}), flush=True)
"""


def _cluster(n):
    return [f"127.0.0.1:{port}" for port in launch.free_ports(n)]


def _join(cluster, index, timeout_seconds, stopped=False, joined=None):
    """A worker joining `cluster`; with `joined` (a folder) it waits there for the others."""
    config = {"cluster": {"worker": cluster}, "task": {"type": "worker", "index": index}}
    env = test_util.child_env(TF_CONFIG=json.dumps(config))
    return forked.Popen(
        [sys.executable, "-c", JOIN, str(timeout_seconds), *([joined] if joined else [])],
        env=env,
        stdout=forked.PIPE,
        stderr=forked.PIPE,
        text=True,
        stopped=stopped,  # frozen before it runs a line
    )


def _outcome(process, limit=90):
    """(The JSON line the worker printed, its stderr); kills it after `limit` seconds."""
    try:
        out, err = process.communicate(timeout=limit)
    except forked.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        raise AssertionError(f"a worker still waited after {limit} s: {err[-2000:]}") from None
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if not lines:
        raise AssertionError(f"exit {process.returncode}, no report: {err[-2000:]}")
    return json.loads(lines[-1]), err


class StartupTest(parameterized.TestCase):
    def test_a_peer_that_never_comes_is_a_timeout_naming_it(self):
        """Worker 0 or 1 of 2 starts; the other never does, or is frozen (SIGSTOP) before its
        server started. Before: TensorFlow waited for ever, deaf to SIGTERM. (The three
        cases run at once, each its own cluster.)"""
        cases = [(0, "missing"), (1, "missing"), (0, "frozen")]
        clusters = [_cluster(2) for _ in cases]
        frozen = []
        for cluster, (index, peer) in zip(clusters, cases):
            if peer == "frozen":
                frozen.append(_join(cluster, 1 - index, 60, stopped=True))
        try:
            start = time.monotonic()
            joining = [_join(c, index, 4) for c, (index, _) in zip(clusters, cases)]
            outcomes = [_outcome(process) for process in joining]
            elapsed = time.monotonic() - start
        finally:
            for process in frozen:
                process.kill()
                process.communicate()
        for cluster, (index, _), (report, err) in zip(clusters, cases, outcomes):
            self.assertEqual(report["error"], "TimeoutError", err[-2000:])
            self.assertIn(f"worker(s) {1 - index} at {cluster[1 - index]}", report["message"])
            self.assertIn("startup_timeout_seconds", report["message"])
        self.assertLess(elapsed, 60)  # the 4 s timeout plus start-up on a loaded machine

    def test_a_late_peer_within_the_timeout_joins(self):
        """Both join, and stay up until both have (as training programs do). Before, worker 0
        left the moment it joined, and worker 1's last call to the coordination service it
        held failed now and then ("Socket closed": once in `.ci/run` at 661e0f5)."""
        joined = tempfile.TemporaryDirectory()
        self.addCleanup(joined.cleanup)
        cluster, joined = _cluster(2), joined.name
        first = _join(cluster, 0, 120, joined=joined)
        time.sleep(1)  # worker 0 waits for worker 1 meanwhile
        second = _join(cluster, 1, 120, joined=joined)
        outcomes = [_outcome(process, limit=150) for process in (first, second)]
        for report, _ in outcomes:  # (on a failure, both workers' reports: which one failed)
            self.assertIsNone(report["error"], "\n".join(f"{r} {e[-1500:]}" for r, e in outcomes))

    def test_a_port_in_use_is_named(self):
        cluster = _cluster(2)
        with socket.socket() as squatter:
            squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            squatter.bind(("", int(cluster[0].rsplit(":", 1)[1])))
            squatter.listen(1)
            report, err = _outcome(_join(cluster, 0, 30))
        self.assertEqual(report["error"], "OSError", err[-2000:])
        self.assertIn(f"Port {cluster[0].rsplit(':', 1)[1]} of worker 0", report["message"])
        self.assertIn("in use", report["message"])


class ExposureTest(absltest.TestCase):
    def test_a_shared_port_is_refused(self):
        with mock.patch.dict(os.environ, {"TF_GRPC_REUSE_PORT": "1"}):
            with self.assertRaisesRegex(ValueError, "TF_GRPC_REUSE_PORT"):
                _rendezvous.check_exposure()

    def test_an_exposed_server_is_said_and_a_private_network_is_not(self):
        interfaces = [(1, "lo"), (2, "eth0")]
        with mock.patch.object(socket, "if_nameindex", return_value=interfaces):
            with mock.patch.dict(os.environ, {_rendezvous.PRIVATE_NETWORK: "elsewhere"}):
                with self.assertLogs(logging.get_absl_logger(), "WARNING") as logs:
                    _rendezvous.check_exposure()
            self.assertIn("eth0 included", logs.output[0])
            own = os.readlink("/proc/self/ns/net")
            with mock.patch.dict(os.environ, {_rendezvous.PRIVATE_NETWORK: own}):
                with self.assertNoLogs(logging.get_absl_logger(), "WARNING"):
                    _rendezvous.check_exposure()
        with mock.patch.object(socket, "if_nameindex", return_value=[(1, "lo")]):
            with mock.patch.dict(os.environ, {_rendezvous.PRIVATE_NETWORK: ""}):
                with self.assertNoLogs(logging.get_absl_logger(), "WARNING"):
                    _rendezvous.check_exposure()


if __name__ == "__main__":
    absltest.main()
