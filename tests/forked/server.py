"""The server of `tests.forked`: forks a child per request, once TensorFlow is imported.

`python -m tests.forked.server SOCKET`: a request per connection (`SOCK_SEQPACKET`), a JSON
message with the child's standard streams attached (`SCM_RIGHTS`), answered with the child's
pid, then, when the child ends, its exit status as `subprocess` gives it (minus the signal
that ended it). It stops when its standard input ends (its client's end). Single-threaded:
`fork` copies only the calling thread, so the server refuses to serve if importing started
another (a lock that thread held would stay held in every child).
"""

import atexit
import json
import os
import runpy
import selectors
import signal
import socket
import sys
import traceback
import types

from tests.forked import MESSAGE


def serve(path: str) -> None:
    """Forks a child per request until its standard input ends (its client's end)."""
    import numpy  # noqa: F401, PLC0415
    import tensorflow  # noqa: F401, PLC0415

    import towers  # noqa: F401, PLC0415  (imports, initializes nothing)

    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:  # fork copies one thread: another's locks would stay held in the child
        print(f"{threads} threads after importing TensorFlow", flush=True)
        return
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    wakeup_read, wakeup_write = os.pipe()
    os.set_blocking(wakeup_write, False)
    signal.set_wakeup_fd(wakeup_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # (the wake-up pipe tells the loop)
    children = {}  # pid -> the connection that asked for it
    print("ready", flush=True)
    with selectors.DefaultSelector() as selector:
        selector.register(listener, selectors.EVENT_READ)
        selector.register(wakeup_read, selectors.EVENT_READ)
        selector.register(sys.stdin.fileno(), selectors.EVENT_READ)
        while True:
            for key, _ in selector.select():
                if key.fileobj == sys.stdin.fileno():
                    if not os.read(key.fd, 1 << 10):  # the client's end: stop serving
                        return
                elif key.fileobj is listener:
                    connection, _ = listener.accept()
                    _fork(connection, children, listener, (wakeup_read, wakeup_write))
                else:
                    os.read(wakeup_read, 1 << 10)
                    _reap(children)


def _fork(connection, children, listener, wakeup) -> None:
    message, fds, _, _ = socket.recv_fds(connection, MESSAGE, 3)
    request = json.loads(message)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        try:
            for other in [*children.values(), connection, listener]:
                other.close()
            for fd in wakeup:
                os.close(fd)
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            _child(request, fds)
        finally:
            os._exit(70)  # (only if the child's own exit failed)
    for fd in fds:
        os.close(fd)
    connection.sendall(json.dumps({"pid": pid}).encode())
    children[pid] = connection


def _reap(children) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        connection = children.pop(pid, None)
        if connection is not None:
            code = os.waitstatus_to_exitcode(status)  # as subprocess: minus a signal's number
            try:
                connection.sendall(json.dumps({"returncode": code}).encode())
            except OSError:
                pass  # the client has gone
            connection.close()


def _child(request: dict, fds: list) -> None:
    """Becomes the process `request` asked for, runs its `__main__`, and exits."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds):
        if fd > 2:
            os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    if request["stopped"]:
        os.kill(os.getpid(), signal.SIGSTOP)
    option, *rest = request["argv"]
    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    code = 0
    try:
        if option == "-c":
            sys.argv, sys.path[0] = ["-c", *rest[1:]], ""
            exec(compile(rest[0], "<string>", "exec"), main.__dict__)
        elif option == "-m":
            sys.argv, sys.path[0] = [rest[0], *rest[1:]], os.getcwd()
            runpy.run_module(rest[0], run_name="__main__", alter_sys=True)
        else:
            sys.argv = [option, *rest]
            sys.path[0] = os.path.dirname(os.path.abspath(option))
            runpy.run_path(option, run_name="__main__")
    except SystemExit as done:
        code = _exit_code(done.code)
    except BaseException as error:  # as the interpreter would: the traceback, then status 1
        traceback.print_exception(type(error), error, error.__traceback__.tb_next)
        code = 1
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


def _exit_code(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    serve(sys.argv[1])
