"""The worker processes of `towers.workers.launch`: started, forwarded, waited for, stopped.

Each worker is a process group of its own, so that stopping it stops its children too, and
starts through `_guard.py`, so that it dies with the launcher, even a SIGKILLed one.
"""

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import IO, TextIO

TIMEOUT_EXIT_CODE = 124  # as `timeout(1)`

GRACE_SECONDS = 5.0  # between SIGTERM and SIGKILL
_POLL_SECONDS = 0.05
JOIN_SECONDS = 2.0  # for the output threads, once the workers' process groups are gone
POPEN_ARGS = dict(
    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
)
GUARD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_guard.py")
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # SIGHUP: its terminal closed


def guarded(command: Sequence[str], *options: str) -> list[str]:
    """`command` started through `_guard.py`: it dies when this process does."""
    return [sys.executable, GUARD, *options, str(os.getpid()), "--", *command]


def write_line(lock: threading.Lock, stream: TextIO, text: str) -> None:
    with lock, contextlib.suppress(OSError, ValueError):  # closed: still drain the pipes
        stream.write(text)
        stream.flush()


def forward(pipe: IO[bytes], write: Callable[[str], None], prefix: str) -> threading.Thread:
    """Starts a thread writing `pipe`'s lines, prefixed; a daemon, as a grandchild may hold it."""

    def forward() -> None:
        with pipe:
            for raw in iter(pipe.readline, b""):
                line = raw.decode("utf-8", errors="replace")
                write(prefix + line + ("" if line.endswith("\n") else "\n"))

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


def stop(
    procs: list[subprocess.Popen],
    grace_seconds: float = GRACE_SECONDS,
    signum: int = signal.SIGTERM,
) -> None:
    """`signum` to every worker's process group, SIGKILL to what is left after the grace period."""
    for proc in procs:
        _signal_group(proc, signum)
    deadline = time.monotonic() + grace_seconds
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
    """Handles SIGINT, SIGTERM, SIGHUP (in the main thread only); the previous handlers."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {signum: signal.signal(signum, handler) for signum in STOP_SIGNALS}


def run(commands, envs, prefixes, timeout_seconds, out, err, grace=GRACE_SECONDS, relay=False):
    """Runs the processes until they end, one fails, time runs out or a signal arrives.

    With `relay` (one process: the launcher in a private network), a signal to this launcher
    goes on to it as it came, for it to stop its workers and say why.

    Returns:
      The exit code, the message saying why, and the name of the signal that killed the
      first process if one did ("" otherwise).
    """
    received: list[int] = []  # signals to the launcher
    previous = handle_stop_signals(lambda signum, frame: received.append(signum))
    procs, threads = [], []
    reaper = _reaper()
    try:
        for command, env, prefix in zip(commands, envs, prefixes):
            # A new session is a new process group: killing it kills the worker's children too.
            procs.append(subprocess.Popen(command, env=env, **POPEN_ARGS))
            reaper.stdin.write(f"{procs[-1].pid}\n")  # its group: the reaper's, if we die
            reaper.stdin.flush()
            threads += [forward(procs[-1].stdout, out, prefix)]
            threads += [forward(procs[-1].stderr, err, prefix)]
        code, message = wait(procs, timeout_seconds, received)
    finally:
        stop(procs, grace, received[0] if relay and received else signal.SIGTERM)
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            reaper.communicate("done\n", timeout=JOIN_SECONDS)  # stopped: nothing to reap
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        deadline = time.monotonic() + JOIN_SECONDS
        for thread in threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
    first = procs[0].returncode if procs else 0
    return code, message, (signal.Signals(-first).name if first and first < 0 else "")


def _reaper() -> subprocess.Popen:
    """`_guard.py --reap`: kills the workers' process groups if this launcher dies first."""
    return subprocess.Popen(
        [sys.executable, GUARD, "--reap"],
        stdin=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a signal to the launcher's group does not reach it
    )


def private_network_unavailable() -> str:
    """Why no private network can be made here ("" when one can): a probe by `_guard.py`."""
    probe = [sys.executable, GUARD, "--private", "--probe"]
    try:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"towers.launch: no private network here: {error}"
    if done.returncode == 0:
        return ""
    return (
        done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"
    )
