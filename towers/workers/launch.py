"""`python -m towers.launch`: N local worker processes with `TF_CONFIG` set, output forwarded.

    python -m towers.launch --workers=N [--timeout_seconds=S] [--ports=auto]
        [--network=auto|private|host] script.py [args...]

Worker i runs `python script.py args...` in its own process group, with `TOWERS_LAUNCH=1` and
`TF_CONFIG` (TensorFlow's convention: every worker's loopback address, and index i) set. Its stdout
and stderr lines reach the launcher's, prefixed with `[worker i] `. When a worker fails, the others
get SIGTERM, then SIGKILL after 5 s, and the launcher exits with the failing code (128 + the signal
for a signal). Launcher flags come before the script; everything after it goes to the script.
Workers die with the launcher, even a SIGKILLed one (Linux).

The workers' servers (TensorFlow's) listen on every interface, unauthenticated. So by default
(`--network=auto`) they run in a private network of their own, where only they reach each other
over loopback: no other host or user can reach them, and they reach nothing outside (no DNS, no
downloads). `auto` falls back to the host's network with a warning where the kernel allows no
unprivileged user namespace; `private` refuses then; `host` keeps the host's network.
"""

import contextlib
import functools
import json
import os
import socket
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import TextIO

from absl import app, flags

if __package__:
    from towers.workers import _guard, _ports, _processes
else:  # run as a file (`python launch.py`): no package, so no TensorFlow; its folder is on the path
    import _guard
    import _ports
    import _processes

TIMEOUT_EXIT_CODE = _processes.TIMEOUT_EXIT_CODE
NETWORKS = ("auto", "private", "host")


def free_ports(n: int) -> list[int]:
    """Picks `n` distinct free TCP ports on 127.0.0.1, below the kernel's ephemeral range.

    A port the kernel hands out (`bind(("", 0))`) lies in its ephemeral range, which every
    outgoing connection of every process on the machine draws from: between the pick and the
    worker's own `bind`, one may take it (the worker then fails, its port in use; the likely
    cause of a rendezvous test's timeout on a machine running 14 test processes). So on
    Linux the ports are drawn at random below `/proc/sys/net/ipv4/ip_local_port_range` (from
    10000), each checked free; elsewhere, or when that range leaves no room, the kernel picks.
    Every socket stays bound until all ports are read, so the ports differ; another process
    may still listen on one before a worker binds it (its error then names the port).

    Args:
      n: How many ports, >= 1.

    Returns:
      `n` distinct port numbers.

    Raises:
      TypeError, ValueError: If `n` is not an int >= 1.
    """
    _check_int("n", n, minimum=1)
    with contextlib.ExitStack() as stack:
        ports: list[int] = []
        candidates = _ports.below_ephemeral()
        while len(ports) < n and candidates:
            sock = stack.enter_context(socket.socket())
            try:
                sock.bind(("127.0.0.1", candidates.pop()))
            except OSError:
                continue
            ports.append(sock.getsockname()[1])
        while len(ports) < n:  # (no room below the range: the kernel picks)
            sock = stack.enter_context(socket.socket())
            sock.bind(("127.0.0.1", 0))
            ports.append(sock.getsockname()[1])
        return ports


def tf_config(ports: Sequence[int], index: int) -> str:
    """The `TF_CONFIG` JSON of worker `index` among loopback workers listening on `ports`.

    Args:
      ports: One distinct port per worker, in worker order.
      index: This worker's index, 0 <= index < len(ports).

    Returns:
      The JSON text.

    Raises:
      TypeError, ValueError: If a port or `index` is not an int in range, or a port repeats.
    """
    if isinstance(ports, str) or not ports or len(set(ports)) != len(ports):
        raise ValueError(f"`ports` must be distinct ports, one per worker; got {ports!r}.")
    for port in ports:
        _check_int("each port", port, minimum=1, maximum=65535)
    _check_int("index", index, minimum=0, maximum=len(ports) - 1)
    cluster = {"worker": [f"127.0.0.1:{port}" for port in ports]}
    return json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})


def launch(
    script_args: Sequence[str],
    workers: int,
    timeout_seconds: float | None = None,
    env: Mapping[str, str] | None = None,
    *,
    ports: Sequence[int] | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    network: str = "auto",
) -> int:
    """Runs `python *script_args` as `workers` local processes until they end; the exit code.

    Args:
      script_args: The script path, then its arguments (passed to it untouched).
      workers: How many processes, >= 1.
      timeout_seconds: Stop every worker after this long; None for no limit.
      env: The workers' base environment (default: this process's); `TF_CONFIG` and
        `TOWERS_LAUNCH=1` are added, and `PYTHONUNBUFFERED=1` unless it is set.
      ports: One port per worker for `TF_CONFIG`; None picks free ones.
      stdout: Where the workers' stdout lines go (default: `sys.stdout`).
      stderr: Where their stderr lines and the launcher's messages go (default: `sys.stderr`).
      network: "auto" (a private network where the kernel allows it, else the host's, with a
        warning), "private" (or an `OSError`) or "host"; see the module's docstring.

    Returns:
      0 if every worker exits 0; else the first failing worker's code (128 + the signal if a
      signal killed it), `TIMEOUT_EXIT_CODE` after a timeout, or 128 + the signal when the
      launcher gets SIGINT or SIGTERM (handled only when called from the main thread).

    Raises:
      TypeError, ValueError: If `workers` is not an int >= 1, the script does not exist,
        `timeout_seconds` <= 0, `ports` does not hold `workers` distinct valid ports, or
        `network` is not one of `NETWORKS`.
      OSError: With `network="private"` where the kernel allows no private network.
    """
    command = _command(script_args)
    _check_int("workers", workers, minimum=1)
    if timeout_seconds is not None and not timeout_seconds > 0:
        raise ValueError(f"`timeout_seconds` must be > 0 or None; got {timeout_seconds!r}.")
    if network not in NETWORKS:
        raise ValueError(f"`network` must be one of {NETWORKS}; got {network!r}.")
    if ports is not None and len(ports) != workers:
        raise ValueError(f"`ports` must hold one port per worker ({workers}); got {ports!r}.")
    lock = threading.Lock()  # one line at a time, across both streams
    out = functools.partial(_processes.write_line, lock, sys.stdout if stdout is None else stdout)
    err = functools.partial(_processes.write_line, lock, sys.stderr if stderr is None else stderr)
    base_env = {"PYTHONUNBUFFERED": "1", **(os.environ if env is None else env)}
    if network != "host":
        tf_config(ports or list(range(1, workers + 1)), 0)  # checks the ports before starting
        unavailable = _processes.private_network_unavailable()
        if not unavailable:  # the workers start there, by this launcher's copy inside
            inner = [sys.executable, os.path.abspath(__file__), f"--workers={workers}"]
            if timeout_seconds is not None:
                inner.append(f"--timeout_seconds={timeout_seconds!r}")
            if ports is not None:
                inner.append(f"--ports={','.join(map(str, ports))}")
            inner = _processes.guarded([*inner, "--network=host", "--", *script_args], "--private")
            code, _, killed = _processes.run(
                [inner], [base_env], [""], None, out, err, grace=8.0, relay=True
            )
            if killed:
                err(f"[launch] the launcher in the private network was killed by {killed}.\n")
            return code
        if network == "private":
            raise OSError(_guard.UNAVAILABLE, f"--network=private: {unavailable}")
        err(
            f"[launch] {unavailable}; the workers use the host's network, where their servers "
            "listen on every interface, unauthenticated (docs/workers.md). Pass "
            "--network=host to say that is intended.\n"
        )
    ports = free_ports(workers) if ports is None else ports
    configs = [tf_config(ports, i) for i in range(workers)]  # checks the ports
    envs = [{**base_env, "TF_CONFIG": c, "TOWERS_LAUNCH": "1"} for c in configs]
    prefixes = [f"[worker {i}] " for i in range(workers)]
    code, message, _ = _processes.run(
        [_processes.guarded(command)] * workers, envs, prefixes, timeout_seconds, out, err
    )
    if message:
        err(f"[launch] {message}\n")
    return code


def _command(script_args: Sequence[str]) -> list[str]:
    """`[python, script, args...]`, once the script is known to exist."""
    if isinstance(script_args, str) or not all(isinstance(a, str) for a in script_args):
        raise TypeError(f"`script_args` must be a list of str; got {script_args!r}.")
    if not script_args:
        raise ValueError("`script_args` is empty; pass the script path, then its arguments.")
    if not os.path.isfile(script_args[0]):
        raise ValueError(
            f"script {script_args[0]!r} not found (cwd: {os.getcwd()}); the first argument "
            "after the launcher's flags is the script."
        )
    return [sys.executable, *script_args]


def _check_int(name: str, value: object, minimum: int, maximum: int | None = None) -> None:
    # Not the package's check (towers.ops.internal): run as a script, this file imports no
    # package, so that the launcher starts without TensorFlow.
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"`{name}` must be an int; got {value!r} ({type(value).__name__}).")
    if value < minimum or (maximum is not None and value > maximum):
        bounds = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ValueError(f"`{name}` must be {bounds}; got {value}.")


def split_argv(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Splits a command line before its first argument that is not a flag (the script path).

    E.g. `["launch", "--workers", "2", "train.py", "--lr=0.1"]`: `["launch", "--workers", "2"]`
    and `["train.py", "--lr=0.1"]`.

    Args:
      argv: The launcher's command line, program name first. A `--` also ends its flags, and
        `--workers`, `--timeout_seconds`, `--ports` and `--network` may take the next argument
        as value.

    Returns:
      The launcher's part (program name and flags), and the script path with its arguments.
    """
    i = 1
    while i < len(argv) and argv[i] != "--" and argv[i].startswith("-"):
        i += 2 if argv[i] in ("--workers", "--timeout_seconds", "--ports", "--network") else 1
    i = min(i, len(argv))
    return list(argv[:i]), list(argv[i + (argv[i : i + 1] == ["--"]) :])


def _define_flags() -> tuple[flags.FlagHolder, ...]:
    """Defines the launcher's flags; called only when the module runs as a program."""
    return (
        flags.DEFINE_integer("workers", None, "Worker processes to start.", lower_bound=1),
        flags.DEFINE_float("timeout_seconds", None, "Stop the workers after this long (seconds)."),
        flags.DEFINE_string("ports", "auto", "'auto' for free ports, or one port per worker: 1,2"),
        flags.DEFINE_enum(
            "network",
            "auto",
            NETWORKS,
            "The workers' network: private (loopback only, no "
            "outside), host, or auto: private where the kernel allows it.",
        ),
    )


def main(argv: list[str], launch_flags: Sequence[flags.FlagHolder]) -> int:
    """Runs `argv[1:]` (the script and its arguments) as the flags say; the exit code.

    Args:
      argv: The program name, the script and its arguments (absl passes the rest as flags).
      launch_flags: The holders of --workers, --timeout_seconds, --ports and --network.

    Returns:
      The exit code, as `launch`'s.
    """
    workers, timeout_seconds, ports_flag, network = launch_flags
    if workers.value is None:
        raise app.UsageError("--workers=N is required.")
    if len(argv) < 2:
        raise app.UsageError("no script: python -m towers.launch --workers=N script.py [args...]")
    text, ports = ports_flag.value, None
    if text != "auto":
        try:
            ports = [int(port) for port in text.split(",")]
        except ValueError as e:
            raise app.UsageError(f"--ports must be 'auto' or ints like 1,2; got {text!r}.") from e
    try:
        return launch(
            argv[1:], workers.value, timeout_seconds.value, ports=ports, network=network.value
        )
    except (TypeError, ValueError) as e:  # raised before any worker starts
        raise app.UsageError(str(e)) from e
    except OSError as e:  # --network=private where none can be made
        print(f"[launch] {e.strerror}", file=sys.stderr)
        return _guard.UNAVAILABLE


def run(argv: Sequence[str]) -> None:
    """`python -m towers.launch`: runs `argv` (`sys.argv`) as the flags say, and exits."""
    program, script = split_argv(argv)  # after `--`, absl leaves the script's arguments
    app.run(functools.partial(main, launch_flags=_define_flags()), [*program, "--", *script])


if __name__ == "__main__":
    run(sys.argv)
