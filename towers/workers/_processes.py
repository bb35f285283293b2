"""The worker processes of `towers.workers.launch`: started, forwarded, waited for, stopped.

Each worker is a process group of its own, so that stopping it stops its children too.
"""

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import IO, TextIO

TIMEOUT_EXIT_CODE = 124  # as `timeout(1)`

_GRACE_SECONDS = 5.0  # between SIGTERM and SIGKILL
_POLL_SECONDS = 0.05
JOIN_SECONDS = 2.0  # for the output threads, once the workers' process groups are gone
POPEN_ARGS = dict(
    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
)


def write_line(lock: threading.Lock, stream: TextIO, text: str) -> None:
    with lock, contextlib.suppress(OSError, ValueError):  # closed: still drain the pipes
        stream.write(text)
        stream.flush()


def forward(pipe: IO[bytes], write: Callable[[str], None], index: int) -> threading.Thread:
    """Starts a thread writing `pipe`'s lines, prefixed; a daemon, as a grandchild may hold it."""

    def forward() -> None:
        with pipe:
            for raw in iter(pipe.readline, b""):
                line = raw.decode("utf-8", errors="replace")
                write(f"[worker {index}] {line}" + ("" if line.endswith("\n") else "\n"))

    thread = threading.Thread(target=forward, daemon=True)
    thread.start()
    return thread


def wait(procs: list[subprocess.Popen], timeout: float | None, got: list[int]) -> tuple[int, str]:
    """Polls the workers until all succeed, one fails, time runs out or a signal arrives."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        running = sum(proc.poll() is None for proc in procs)
        if got:  # a signal to the launcher
            return 128 + got[0], f"received {_signal_name(got[0])}; stopped {running} worker(s)."
        for i, proc in enumerate(procs):
            if proc.returncode:  # the first failure, in worker order when several end together
                code = 128 - proc.returncode if proc.returncode < 0 else proc.returncode
                how = f"exited with code {code}"
                if proc.returncode < 0:
                    how = f"was killed by signal {-proc.returncode} ({_signal_name(code - 128)})"
                message = f"worker {i} {how}; stopped the {running} other running worker(s)."
                return (code if 0 < code < 256 else 1), message
        if not running:
            return 0, ""
        if deadline is not None and time.monotonic() >= deadline:
            message = f"timed out after {timeout:g} s (--timeout_seconds); stopped {running} "
            return TIMEOUT_EXIT_CODE, message + f"running worker(s), exit {TIMEOUT_EXIT_CODE}."
        time.sleep(_POLL_SECONDS)  # a signal's handler runs during the sleep


def _signal_name(signum: int) -> str:
    return next((s.name for s in signal.Signals if s == signum), "unknown")


def stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM to every worker's process group, SIGKILL to what is left after the grace period."""
    for proc in procs:
        _signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + _GRACE_SECONDS
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    for proc in procs:
        _signal_group(proc, signal.SIGKILL)  # also the children of workers that already ended
        proc.wait()


def _signal_group(proc: subprocess.Popen, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is gone
        os.killpg(proc.pid, signum)


def handle_stop_signals(handler: Callable[[int, object], None]) -> dict[int, object]:
    """Handles SIGINT and SIGTERM (possible in the main thread only); the previous handlers."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {signum: signal.signal(signum, handler) for signum in (signal.SIGINT, signal.SIGTERM)}
