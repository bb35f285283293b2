"""Python processes for tests, forked from a server that has imported TensorFlow already.

Importing TensorFlow costs a process 3-5 s of CPU on the 2-core machine the suite runs on,
and tests start about 40 processes that import it: the workers of a cluster, a saver killed
mid-write, a second writer. `Popen` and `run` take the arguments of their `subprocess`
namesakes, and start `[sys.executable, "-c", code, ...]`, `[sys.executable, "-m", module,
...]` or `[sys.executable, script, ...]` by asking a server to fork itself: one server per
test process, started on first use, that imported NumPy, TensorFlow and towers and nothing
more (no device, no runtime, one thread: `fork` is safe there). The child is a process like any
other: its own pid, files, signals (SIGKILL and SIGSTOP act on it as on any) and exit
status. Before it runs its `__main__`, it takes what the command line and `subprocess` would
have given it: the environment, the working directory, the standard streams, `sys.argv` and
`sys.path[0]`. What it cannot take (other `PYTHON*` variables, interpreter options, a server
that could not start) makes `Popen` start a real interpreter instead, as `subprocess` does.

Tests whose point is a fresh interpreter (what an import costs or prints, what a new process
finds on its path) use `subprocess` itself.

The server is `tests/forked/server.py`.
"""

import atexit
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

MESSAGE = 1 << 20  # the largest message between a client and the server, bytes
PIPE, STDOUT, DEVNULL = subprocess.PIPE, subprocess.STDOUT, subprocess.DEVNULL
TimeoutExpired, CompletedProcess = subprocess.TimeoutExpired, subprocess.CompletedProcess


class Popen:
    """`subprocess.Popen(args, ...)` for a Python process, forked from the server.

    Supports what the suite uses: `stdin`, `stdout`, `stderr` (None, `PIPE`, `DEVNULL`,
    `STDOUT` for stderr, or a file), `env`, `cwd`, `text`; `pid`, `returncode`, `stdout`,
    `stderr`, `poll`, `wait`, `communicate`, `send_signal`, `terminate` and `kill`. Anything
    a fork cannot give (see the module's docstring) starts `subprocess.Popen` instead.

    One addition: `stopped=True` gives a process frozen as it starts, SIGSTOPped before it
    runs a line of its own (a real interpreter gets the signal as soon as it exists).
    """

    def __init__(self, args, *, stdin=None, stdout=None, stderr=None, env=None, cwd=None,
                 text=False, stopped=False):  # fmt: skip
        env = dict(os.environ if env is None else env)
        server = _server() if _plain(args) else None
        if server is None or not _same_python(env, server["env"]):
            self._real = subprocess.Popen(args, stdin=stdin, stdout=stdout, stderr=stderr,
                                          env=env, cwd=cwd, text=text)  # fmt: skip
            self.pid, self.stdin = self._real.pid, self._real.stdin
            self.stdout, self.stderr = self._real.stdout, self._real.stderr
            if stopped:
                os.kill(self.pid, signal.SIGSTOP)
            return
        self._real, self.returncode = None, None
        self.stdin = self.stdout = self.stderr = None
        self._chunks = {}  # what communicate has read of each pipe (it may be called again)
        ends, self._close = [], []
        for fd, how in enumerate((stdin, stdout, stderr)):
            ends.append(self._end(fd, how, ends, text))
        request = {
            "argv": list(args[1:]),
            "env": env,
            "cwd": os.path.abspath(cwd or "."),
            "stopped": stopped,
        }
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._socket.connect(server["path"])
            socket.send_fds(self._socket, [json.dumps(request).encode()], ends)
            self.pid = json.loads(self._socket.recv(MESSAGE))["pid"]
        finally:
            for fd in self._close:
                os.close(fd)

    def _end(self, fd, how, ends, text):
        """The file descriptor the child gets as `fd`; keeps this side of a pipe."""
        if how == STDOUT:
            return ends[1]
        if how is None:
            if fd == 0:  # (never the test process's own stdin: pytest-xdist talks on it)
                how = DEVNULL
            else:
                return fd
        if how == DEVNULL:
            end = os.open(os.devnull, os.O_RDWR)
            self._close.append(end)
            return end
        if how != PIPE:
            return how if isinstance(how, int) else how.fileno()
        read, write = os.pipe()
        mine, theirs = (write, read) if fd == 0 else (read, write)
        self._close.append(theirs)
        mode = ("w" if fd == 0 else "r") + ("" if text else "b")
        setattr(self, ("stdin", "stdout", "stderr")[fd], os.fdopen(mine, mode))
        return theirs

    def poll(self):
        if self._real is not None:
            return self._real.poll()
        if self.returncode is None:
            self._receive(0)
        return self.returncode

    def wait(self, timeout=None):
        if self._real is not None:
            return self._real.wait(timeout)
        if self.returncode is None and not self._receive(timeout):
            raise TimeoutExpired(["forked", self.pid], timeout)
        return self.returncode

    def _receive(self, timeout) -> bool:
        """Takes the exit status if the server sends it within `timeout` seconds (None:
        however long it takes); whether it came."""
        self._socket.settimeout(timeout)
        try:
            message = self._socket.recv(MESSAGE)
        except (TimeoutError, BlockingIOError):
            self._socket.settimeout(None)
            return False
        self._socket.close()
        if not message:
            raise RuntimeError(f"tests.forked: the server died before process {self.pid} ended")
        self.returncode = json.loads(message)["returncode"]
        return True

    def communicate(self, timeout=None):
        """(stdout, stderr) read to their ends, then the exit status; as `subprocess`."""
        if self._real is not None:
            return self._real.communicate(timeout=timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        pipes = [f for f in (self.stdout, self.stderr) if f is not None]
        chunks = self._chunks
        for f in pipes:
            chunks.setdefault(f, [])
        with selectors.DefaultSelector() as selector:
            for f in pipes:
                if not f.closed:
                    selector.register(f.fileno(), selectors.EVENT_READ, f)
            while selector.get_map():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutExpired(["forked", self.pid], timeout)
                for key, _ in selector.select(left):
                    data = os.read(key.fd, 1 << 16)
                    if data:
                        chunks[key.data].append(data)
                    else:
                        selector.unregister(key.fd)
                        key.data.close()
        self.wait(None if deadline is None else max(deadline - time.monotonic(), 0.01))
        return tuple(self._joined(f, chunks) for f in (self.stdout, self.stderr))

    @staticmethod
    def _joined(f, chunks):
        if f is None:
            return None
        data = b"".join(chunks[f])
        return data.decode() if "b" not in f.mode else data

    def send_signal(self, signum):
        if self._real is not None:
            return self._real.send_signal(signum)
        if self.poll() is None:
            os.kill(self.pid, signum)

    def terminate(self):
        self.send_signal(signal.SIGTERM)

    def kill(self):
        self.send_signal(signal.SIGKILL)


def run(args, *, input=None, capture_output=False, timeout=None, check=False, **kwargs):
    """`subprocess.run` on `Popen`."""
    if input is not None:
        raise ValueError("tests.forked.run takes no input.")
    if capture_output:
        kwargs.update(stdout=PIPE, stderr=PIPE)
    process = Popen(args, **kwargs)
    try:
        out, err = process.communicate(timeout=timeout)
    except TimeoutExpired:
        process.kill()
        process.communicate()
        raise
    if check and process.returncode:
        raise subprocess.CalledProcessError(process.returncode, args, out, err)
    return CompletedProcess(args, process.returncode, out, err)


def _plain(args) -> bool:
    """Whether `args` is this interpreter on code, a module or a script, with no option."""
    args = list(args)
    if len(args) < 2 or args[0] != sys.executable:
        return False
    return args[1] in ("-c", "-m") or not args[1].startswith("-")


def _same_python(env: dict, server_env: dict) -> bool:
    """Whether `env` sets Python up as the server's did (`PYTHONPATH`: its `sys.path`)."""

    def python(variables):
        return {k: v for k, v in variables.items() if k.startswith("PYTHON")}

    return python(env) == python(server_env)


_started = {}  # this process's server: {"server": {"path", "env"} or None, "process": it}
_lock = threading.Lock()


def _server():
    """This process's server ({"path": its socket, "env": its environment}), started on
    first use; None if it could not start (`Popen` then starts real interpreters)."""
    with _lock:
        if "server" not in _started:
            _started["server"] = _start()
        return _started["server"]


def _start():
    from tests import test_util  # noqa: PLC0415  (child_env: the repository on the path)

    env = test_util.child_env(OPENBLAS_NUM_THREADS="1")  # (else NumPy starts a thread)
    path = os.path.join(tempfile.mkdtemp(prefix="forked."), "socket")
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.forked.server", path],
        stdin=PIPE,  # its end is this process's end: the server stops when this one does
        stdout=PIPE,
        stderr=DEVNULL,
        env=env,
        cwd=test_util.ROOT,
    )
    ready = process.stdout.readline().decode().strip()
    if ready != "ready":
        process.kill()
        process.wait()
        sys.stderr.write(f"tests.forked: no server ({ready or 'it exited'}); plain processes\n")
        return None
    _started["process"] = process
    atexit.register(shutil.rmtree, os.path.dirname(path), ignore_errors=True)
    atexit.register(process.stdin.close)  # (runs first: the server stops)
    return {"path": path, "env": env}
