"""`tests.forked`: processes forked from a server are what `subprocess` would have started."""

import json
import os
import signal
import sys
import tempfile
import time

import tensorflow as tf

from tests import forked, test_util

REPORT = (
    "import json, os, sys\n"
    "print(json.dumps({'argv': sys.argv, 'path0': sys.path[0], 'cwd': os.getcwd(),\n"
    "                  'mine': os.environ.get('MINE'), 'main': __name__, 'pid': os.getpid()}))\n"
)


class ForkedTest(tf.test.TestCase):
    def _report(self, args, **kwargs):
        done = forked.run(
            [sys.executable, *args], env=test_util.child_env(MINE="yes"), capture_output=True,
            text=True, timeout=60, **kwargs,
        )  # fmt: skip
        self.assertEqual(done.returncode, 0, done.stderr)
        return json.loads(done.stdout)

    def test_code_modules_and_scripts_see_their_command_line(self):
        with tempfile.TemporaryDirectory() as directory:
            script = os.path.join(directory, "report.py")
            with open(script, "w") as f:
                f.write(REPORT)
            by_code = self._report(["-c", REPORT, "a", "b"], cwd=directory)
            by_script = self._report([script, "c"])
        self.assertEqual(by_code["argv"], ["-c", "a", "b"])
        self.assertEqual(by_code["path0"], "")
        self.assertEqual(os.path.realpath(by_code["cwd"]), os.path.realpath(directory))
        self.assertEqual((by_code["mine"], by_code["main"]), ("yes", "__main__"))
        self.assertEqual(by_script["argv"], [script, "c"])
        self.assertEqual(by_script["path0"], directory)
        self.assertNotEqual(by_code["pid"], by_script["pid"])
        by_module = forked.run(
            [sys.executable, "-m", "tests.towers.workers.jobs"], env=test_util.child_env(),
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        self.assertEqual((by_module.returncode, by_module.stderr), (0, ""))

    def test_exit_status_streams_and_errors_as_an_interpreter_gives_them(self):
        env = test_util.child_env()
        code = "import sys; print('out'); sys.stderr.write('err\\n'); sys.exit(3)"
        done = forked.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        self.assertEqual((done.returncode, done.stdout, done.stderr), (3, "out\n", "err\n"))
        done = forked.run(
            [sys.executable, "-c", "raise ValueError('boom')"], env=env, capture_output=True
        )
        self.assertEqual(done.returncode, 1)
        self.assertIn(b'File "<string>", line 1', done.stderr)
        self.assertTrue(done.stderr.endswith(b"ValueError: boom\n"), done.stderr)
        self.assertNotIn(b"forked.py", done.stderr)  # the traceback is the program's own
        done = forked.run(
            [sys.executable, "-c", "print(1)"], env=env, stdout=forked.PIPE,
            stderr=forked.STDOUT, timeout=60,
        )  # fmt: skip
        self.assertEqual(done.stdout, b"1\n")

    def test_a_child_is_a_process_signals_reach(self):
        env = test_util.child_env()
        child = forked.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
        with self.assertRaises(forked.TimeoutExpired):
            child.wait(0.2)
        self.assertIsNone(child.poll())
        child.kill()
        self.assertEqual(child.wait(10), -signal.SIGKILL)
        stopped = forked.Popen(
            [sys.executable, "-c", "print('ran', flush=True)"], env=env, stdout=forked.PIPE,
            stopped=True,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while _state(stopped.pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertEqual(_state(stopped.pid), "T")  # stopped before a line of its own ran
        os.kill(stopped.pid, signal.SIGCONT)
        self.assertEqual(stopped.communicate(timeout=30), (b"ran\n", None))
        self.assertEqual(stopped.returncode, 0)

    def test_other_python_settings_start_a_real_interpreter(self):
        seed = "8" if os.environ.get("PYTHONHASHSEED") == "7" else "7"
        env = test_util.child_env(PYTHONHASHSEED=seed)  # not the server's
        child = forked.Popen([sys.executable, "-c", "pass"], env=env)
        self.assertIsInstance(child._real, forked.subprocess.Popen)
        self.assertEqual(child.wait(60), 0)
        forkable = forked.Popen([sys.executable, "-c", "pass"], env=test_util.child_env())
        self.assertIsNone(forkable._real)
        self.assertEqual(forkable.wait(60), 0)


def _state(pid: int) -> str:
    """The process's state letter from /proc (T: stopped), or "" once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return ""


if __name__ == "__main__":
    tf.test.main()
