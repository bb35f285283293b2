"""`python -m towers.launch` with real worker processes: small Python scripts, no TensorFlow.

Most tests run the launcher file as a script (`python .../launch.py`), which imports no package and
so no TensorFlow; one runs it with `-m`. Every launcher run has a bounded `timeout`.
"""

import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from unittest import mock

from absl import flags
from absl.testing import absltest

from towers.workers import launch

_TIMEOUT = 20  # seconds, for every launcher run

# Each worker script starts with this; the output directory is its first argument.
_PRELUDE = """\
import json, os, signal, subprocess, sys, time
INDEX = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
OUT = sys.argv[1]

def note(name, value):
    with open(os.path.join(OUT, name + ".tmp"), "w") as f:
        f.write(str(value))
    os.replace(os.path.join(OUT, name + ".tmp"), os.path.join(OUT, name))

def wait_for_pids(count):
    deadline = time.time() + 10
    while time.time() < deadline:
        if len([n for n in os.listdir(OUT) if n.endswith(".pid")]) >= count:
            return
        time.sleep(0.05)

def sleep_with_a_child():
    note(f"worker{INDEX}.pid", os.getpid())
    child = subprocess.Popen(["sleep", "60"])
    note(f"child{INDEX}.pid", child.pid)
    time.sleep(60)
"""

_REPORT = """
print(json.dumps({"config": json.loads(os.environ["TF_CONFIG"]), "argv": sys.argv[2:],
                  "launch": os.environ.get("TOWERS_LAUNCH"), "mine": os.environ.get("MINE")}))
for i in range(100):
    print(f"line {i} " + "x" * 300)
    print(f"err {i} " + "y" * 300, file=sys.stderr)
"""


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def _worker_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if not line.startswith("[launch] ")]


class LaunchTest(absltest.TestCase):
    def setUp(self):
        super().setUp()
        self.dir = tempfile.mkdtemp()
        self.out = os.path.join(self.dir, "out")
        os.mkdir(self.out)
        self.addCleanup(shutil.rmtree, self.dir, ignore_errors=True)

    def _script(self, body: str) -> str:
        path = os.path.join(self.dir, "worker.py")
        with open(path, "w") as f:
            f.write(_PRELUDE + textwrap.dedent(body))
        return path

    def _run(self, *args: str, command: tuple[str, ...] = (), env=None):
        """Runs the launcher (by default the file, as a script); the result and its duration."""
        start = time.monotonic()
        done = subprocess.run(
            [*(command or (sys.executable, launch.__file__)), *args],
            capture_output=True,
            text=True,
            timeout=_TIMEOUT,
            cwd=self.dir,
            env=env,
            check=False,
        )
        return done, time.monotonic() - start

    def _pids(self) -> dict[str, int]:
        return {
            name: int(open(os.path.join(self.out, name)).read())
            for name in os.listdir(self.out)
            if name.endswith(".pid")
        }

    def _assert_dead(self, pids: dict[str, int]) -> None:
        deadline = time.monotonic() + 3  # the reparented children are reaped by init
        while any(map(_alive, pids.values())) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual({n: p for n, p in pids.items() if _alive(p)}, {})

    def _reports(self, stdout: str) -> dict[int, dict]:
        """The JSON line of each worker, by the index in its prefix."""
        reports = {}
        for line in stdout.splitlines():
            match = re.fullmatch(r"\[worker (\d)\] (\{.*\})", line)
            if match:
                reports[int(match.group(1))] = json.loads(match.group(2))
        return reports

    def test_each_worker_gets_its_index_in_one_cluster_and_whole_prefixed_lines(self):
        done, _ = self._run("--workers=3", self._script(_REPORT), self.out)
        self.assertEqual(done.returncode, 0, done.stderr[-2000:])
        reports = self._reports(done.stdout)
        self.assertEqual(sorted(reports), [0, 1, 2])
        cluster = reports[0]["config"]["cluster"]
        self.assertLen(cluster["worker"], 3)
        self.assertLen({address.split(":")[1] for address in cluster["worker"]}, 3)
        for index, report in reports.items():
            self.assertEqual(report["config"]["task"], {"type": "worker", "index": index})
            self.assertEqual(report["config"]["cluster"], cluster)
            self.assertEqual(report["launch"], "1")
        for line in done.stdout.splitlines():
            self.assertRegex(line, r"^\[worker [0-2]\] (line \d+ x{300}|\{.*\})$")
        errors = _worker_lines(done.stderr)  # not the warning of a host without private network
        for line in errors:
            self.assertRegex(line, r"^\[worker [0-2]\] err \d+ y{300}$")
        self.assertLen(done.stdout.splitlines(), 3 * 101)
        self.assertLen(errors, 3 * 100)

    def test_a_failing_worker_stops_the_others_and_their_children(self):
        script = self._script("""
            if INDEX == 0:
                wait_for_pids(4)
                note("failed_at", time.time())
                sys.exit(3)
            sleep_with_a_child()
        """)
        done, seconds = self._run("--workers=3", script, self.out)
        self.assertEqual(done.returncode, 3, done.stderr[-2000:])
        self.assertIn("[launch] worker 0 exited with code 3", done.stderr)
        failed_at = float(open(os.path.join(self.out, "failed_at")).read())
        self.assertLess(time.time() - failed_at, 4)  # SIGTERM suffices, no 5 s grace
        self.assertLen(self._pids(), 4)
        self._assert_dead(self._pids())

    def test_a_worker_killed_by_a_signal_gives_128_plus_the_signal(self):
        script = self._script("""
            if INDEX == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(60)
        """)
        done, seconds = self._run("--workers=2", script, self.out)
        self.assertEqual(done.returncode, 128 + 9, done.stderr[-2000:])
        self.assertIn("worker 1 was killed by signal 9 (SIGKILL)", done.stderr)
        self.assertLess(seconds, 5)

    def test_timeout_stops_every_worker(self):
        done, seconds = self._run(
            "--workers=2",
            "--timeout_seconds=2",
            self._script("""
            sleep_with_a_child()
        """),
            self.out,
        )
        self.assertEqual(done.returncode, launch.TIMEOUT_EXIT_CODE, done.stderr[-2000:])
        self.assertIn("[launch] timed out after 2 s", done.stderr)
        self.assertBetween(seconds, 2, 5)
        self._assert_dead(self._pids())

    def test_the_arguments_after_the_script_reach_it_untouched(self):
        script = self._script(_REPORT)
        done, _ = self._run("--workers", "2", script, self.out, "--foo=bar", "x", "--workers=7")
        self.assertEqual(done.returncode, 0, done.stderr[-2000:])
        reports = self._reports(done.stdout)
        self.assertEqual(
            [r["argv"] for r in reports.values()], [["--foo=bar", "x", "--workers=7"]] * 2
        )

    def test_runs_as_a_module(self):
        """`python -m towers.launch` (in the repository this imports TensorFlow: a few seconds)."""
        depth = len(launch.__name__.split("."))
        root = os.path.abspath(launch.__file__)
        for _ in range(depth):
            root = os.path.dirname(root)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ["PYTHONPATH"]])}
        done, _ = self._run(
            "--workers=1",
            self._script(_REPORT),
            self.out,
            "--x",
            command=(sys.executable, "-m", launch.__name__),
            env=env,
        )
        self.assertEqual(done.returncode, 0, done.stderr[-2000:])
        self.assertEqual(self._reports(done.stdout)[0]["argv"], ["--x"])

    def test_sigterm_to_the_launcher_stops_the_workers(self):
        script = self._script("""
            sleep_with_a_child()
        """)
        proc = subprocess.Popen(
            [sys.executable, launch.__file__, "--workers=2", script, self.out],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=self.dir,
        )
        self.addCleanup(proc.kill)
        deadline = time.monotonic() + 10
        while len(self._pids()) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=_TIMEOUT)
        self.assertEqual(proc.returncode, 128 + signal.SIGTERM, stderr[-2000:])
        self.assertIn("[launch] received SIGTERM", stderr)
        self.assertLen(self._pids(), 4)
        self._assert_dead(self._pids())

    def test_a_worker_ignoring_sigterm_is_killed_after_the_grace_period(self):
        script = self._script("""
            if INDEX == 0:
                wait_for_pids(1)
                sys.exit(1)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            note("stubborn.pid", os.getpid())
            time.sleep(60)
        """)
        done, seconds = self._run("--workers=2", script, self.out)
        self.assertEqual(done.returncode, 1, done.stderr[-2000:])
        self.assertBetween(seconds, 4.5, 12)
        self._assert_dead(self._pids())

    def test_in_process_with_an_environment_and_streams(self):
        stdout, stderr = io.StringIO(), io.StringIO()
        handler = signal.getsignal(signal.SIGTERM)
        script = self._script(_REPORT)
        env = {**os.environ, "MINE": "yes", "TF_CONFIG": "overridden"}
        code = launch.launch([script, self.out], 2, 15, env, stdout=stdout, stderr=stderr)
        self.assertEqual(code, 0, stderr.getvalue()[-2000:])
        reports = self._reports(stdout.getvalue())
        self.assertEqual(sorted(reports), [0, 1])
        self.assertEqual({r["mine"] for r in reports.values()}, {"yes"})
        self.assertLen(_worker_lines(stderr.getvalue()), 200)
        self.assertIs(signal.getsignal(signal.SIGTERM), handler)

    def test_bad_command_lines_are_refused_clearly(self):
        script = self._script(_REPORT)
        done, _ = self._run("--workers=0", script, self.out)
        self.assertNotEqual(done.returncode, 0)
        self.assertIn("flag --workers=0: 0 is not a positive integer", done.stderr)
        done, _ = self._run("--workers=2", "missing.py")
        self.assertNotEqual(done.returncode, 0)
        self.assertIn("script 'missing.py' not found", done.stderr)
        done, _ = self._run(script)
        self.assertNotEqual(done.returncode, 0)
        self.assertIn("--workers=N is required", done.stderr)
        done, _ = self._run("--workers=2", "--ports=1,x", script)
        self.assertIn("--ports must be 'auto' or ints like 1,2; got '1,x'", done.stderr)
        done, _ = self._run("--workers=2", "--network=open", script)
        self.assertIn("--network=open: value should be one of <auto|private|host>", done.stderr)
        self.assertEqual(os.listdir(self.out), [])  # no worker ran

    def test_bad_arguments_are_refused_clearly(self):
        script = self._script(_REPORT)
        with self.assertRaisesRegex(ValueError, r"`workers` must be >= 1; got 0"):
            launch.launch([script], 0)
        with self.assertRaisesRegex(TypeError, r"`workers` must be an int; got '2'"):
            launch.launch([script], "2")
        with self.assertRaisesRegex(ValueError, r"script 'missing.py' not found"):
            launch.launch(["missing.py"], 2)
        with self.assertRaisesRegex(TypeError, r"`script_args` must be a list of str"):
            launch.launch(script, 2)
        with self.assertRaisesRegex(ValueError, r"`timeout_seconds` must be > 0 or None; got 0"):
            launch.launch([script], 2, timeout_seconds=0)
        with self.assertRaisesRegex(ValueError, r"`ports` must be distinct ports"):
            launch.launch([script], 2, ports=[5000, 5000])
        with self.assertRaisesRegex(ValueError, r"one port per worker \(2\); got \[5000\]"):
            launch.launch([script], 2, ports=[5000])
        with self.assertRaisesRegex(ValueError, r"each port` must be in \[1, 65535\]; got 70000"):
            launch.launch([script], 2, ports=[5000, 70000])
        with self.assertRaisesRegex(ValueError, r"`network` must be one of"):
            launch.launch([script], 2, network="none")
        with self.assertRaisesRegex(ValueError, r"`ports` must be distinct ports"):
            launch.launch([script], 2, ports=[5000, 5000], network="private")
        with self.assertRaisesRegex(ValueError, r"`n` must be >= 1; got 0"):
            launch.free_ports(0)
        with self.assertRaisesRegex(ValueError, r"`index` must be in \[0, 1\]; got 2"):
            launch.tf_config([5000, 5001], 2)


class PortsAndConfigTest(absltest.TestCase):
    def test_free_ports_are_distinct(self):
        ports = launch.free_ports(8)
        self.assertLen(set(ports), 8)
        self.assertTrue(all(0 < port < 65536 for port in ports))

    def test_free_ports_lie_below_the_ephemeral_range(self):
        """No process's outgoing connection can take one before a worker binds it."""
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
        self.assertTrue(all(10000 <= port < low for port in launch.free_ports(8)))
        with mock.patch.object(
            launch._ports, "below_ephemeral", return_value=[]
        ):  # no room: kernel
            self.assertTrue(all(port >= low for port in launch.free_ports(3)))
        with socket.socket() as taken:  # a port in use below the range is passed over
            taken.bind(("127.0.0.1", 0))
            busy = taken.getsockname()[1]
            with mock.patch.object(launch._ports, "below_ephemeral", return_value=[low - 1, busy]):
                self.assertEqual(launch.free_ports(1), [low - 1])

    def test_tf_config_follows_tensorflow(self):
        self.assertEqual(
            json.loads(launch.tf_config([5000, 5001, 5002], 2)),
            {
                "cluster": {"worker": ["127.0.0.1:5000", "127.0.0.1:5001", "127.0.0.1:5002"]},
                "task": {"type": "worker", "index": 2},
            },
        )

    def test_importing_defines_no_flags(self):
        for name in ("workers", "timeout_seconds", "ports", "network"):
            self.assertNotIn(name, flags.FLAGS)

    def test_split_argv(self):
        self.assertEqual(
            launch.split_argv(["l", "--workers=2", "--ports", "auto", "s.py", "--ports=1"]),
            (["l", "--workers=2", "--ports", "auto"], ["s.py", "--ports=1"]),
        )
        self.assertEqual(launch.split_argv(["l", "--", "-s.py"]), (["l"], ["-s.py"]))


if __name__ == "__main__":
    absltest.main()
