"""Launched processes die with their launcher, and meet in a private network: real processes,
SIGKILL, and connections from outside (`_guard.py`, through `towers.launch`)."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from absl.testing import absltest, parameterized

from tests.towers.workers.launch_test import _PRELUDE, _alive
from towers.workers import _guard, _processes, launch

# Worker i listens on its TF_CONFIG port on every interface (as TensorFlow's server does), says
# so, and worker 1 connects to worker 0's port.
_LISTEN = """
import socket
config = json.loads(os.environ["TF_CONFIG"])
addresses = config["cluster"]["worker"]
server = socket.socket()
server.bind(("", int(addresses[INDEX].rsplit(":", 1)[1])))
server.listen()
if INDEX == 1:
    deadline = time.time() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", int(addresses[0].rsplit(":", 1)[1])), 2).close()
            note("reached", 1)
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.05)
note(f"port{INDEX}", addresses[INDEX].rsplit(":", 1)[1])
note(f"netns{INDEX}", os.environ.get("TOWERS_NETNS", "") + " " + os.readlink("/proc/self/ns/net"))
child = subprocess.Popen(["sleep", "60"])  # a process of the worker's own
note(f"child{INDEX}.pid", child.pid)
note(f"worker{INDEX}.pid", os.getpid())
time.sleep(60)
"""
PRIVATE = not _processes.private_network_unavailable()


def _reachable(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


class GuardTest(parameterized.TestCase):
    def setUp(self):
        super().setUp()
        self.dir = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)
        self.out = os.path.join(self.dir, "out")
        os.mkdir(self.out)
        self.script = os.path.join(self.dir, "worker.py")
        with open(self.script, "w") as f:
            f.write(_PRELUDE + _LISTEN)

    def _read(self, name: str) -> str:
        with open(os.path.join(self.out, name)) as f:
            return f.read()

    def _start(self, *flags: str) -> subprocess.Popen:
        """The launcher with 2 workers of `_LISTEN`, once both listen (and 1 reached 0)."""
        launcher = subprocess.Popen(
            [sys.executable, launch.__file__, "--workers=2", *flags, self.script, self.out],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.addCleanup(launcher.kill)
        deadline = time.monotonic() + 20
        while not all(os.path.exists(os.path.join(self.out, f"worker{i}.pid")) for i in (0, 1)):
            if launcher.poll() is not None or time.monotonic() > deadline:
                launcher.kill()
                raise AssertionError(f"workers did not start: {launcher.communicate()[1]}")
            time.sleep(0.05)
        return launcher

    @parameterized.parameters("--network=host", "--network=auto")
    def test_a_sigkilled_launcher_leaves_no_worker_and_no_port(self, network):
        """Before: both workers (and their children) ran on under PID 1, ports open."""
        launcher = self._start(network)
        pids = [int(self._read(f"{kind}{i}.pid")) for i in (0, 1) for kind in ("worker", "child")]
        ports = [int(self._read(f"port{i}")) for i in (0, 1)]
        self.assertTrue(all(map(_alive, pids)))
        if network == "--network=host":
            self.assertTrue(all(map(_reachable, ports)))  # so that the check below can fail
        launcher.kill()
        launcher.communicate()
        deadline = time.monotonic() + 3  # the stated bound: docs/workers.md
        while any(map(_alive, pids)) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual([p for p in pids if _alive(p)], [])
        self.assertEqual([p for p in ports if _reachable(p)], [])

    def test_sighup_to_the_launcher_stops_the_workers(self):
        launcher = self._start()
        pids = [int(self._read(f"worker{i}.pid")) for i in (0, 1)]
        launcher.send_signal(signal.SIGHUP)
        _, stderr = launcher.communicate(timeout=20)
        self.assertEqual(launcher.returncode, 128 + signal.SIGHUP, stderr[-2000:])
        self.assertIn("[launch] received SIGHUP", stderr)
        self.assertEqual([p for p in pids if _alive(p)], [])

    def test_workers_meet_in_a_network_nobody_else_reaches(self):
        """Where the kernel allows a private network (else: private refuses, auto warns)."""
        if not PRIVATE:
            done = subprocess.run(
                [sys.executable, launch.__file__, "--workers=2", "--network=private", self.script],
                capture_output=True,
                text=True,
                timeout=20,
                check=False,
            )
            self.assertEqual(done.returncode, _guard.UNAVAILABLE, done.stderr)
            self.assertIn("no private network here", done.stderr)
            self.assertEqual(os.listdir(self.out), [])
            return
        launcher = self._start("--network=private")
        self.assertEqual(self._read("reached"), "1")  # worker 1 reached worker 0 inside
        mine = os.readlink("/proc/self/ns/net")
        for i in (0, 1):
            announced, actual = self._read(f"netns{i}").split()
            self.assertEqual(announced, actual)  # what init_workers checks
            self.assertNotEqual(actual, mine)
            self.assertFalse(_reachable(int(self._read(f"port{i}"))))  # listening, inside only
        launcher.send_signal(signal.SIGTERM)
        launcher.communicate(timeout=20)
        self.assertEqual(launcher.returncode, 128 + signal.SIGTERM)

    def test_a_process_whose_launcher_already_ended_does_not_run(self):
        with tempfile.TemporaryDirectory() as scratch:
            mark = os.path.join(scratch, "ran")
            command = [sys.executable, "-c", f"open({mark!r}, 'w').close()"]
            orphan = [sys.executable, _processes.GUARD, "1", "--", *command]  # not its parent
            done = subprocess.run(orphan, timeout=20, check=False)
            self.assertEqual(done.returncode, -signal.SIGKILL)
            self.assertFalse(os.path.exists(mark))
            done = subprocess.run(_processes.guarded(command), timeout=20, check=False)
            self.assertEqual(done.returncode, 0)
            self.assertTrue(os.path.exists(mark))
            echo = [sys.executable, "-c", "import sys; print(sys.argv[1:])", "--private", "x"]
            done = subprocess.run(
                _processes.guarded(echo), capture_output=True, text=True, timeout=20, check=False
            )
            self.assertEqual(done.stdout.strip(), "['--private', 'x']")  # the command's own

    def test_a_private_network_needs_one_thread(self):
        """In a process where threads run already (this one: TensorFlow's), it refuses."""
        with self.assertRaisesRegex(OSError, "threads run already"):
            _guard.enter_private_network()


if __name__ == "__main__":
    absltest.main()
