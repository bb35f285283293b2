"""What `towers.launch` starts its processes through: they die with it, maybe in private.

Each process dies with its launcher, and the launcher's own copy may enter a private network
first. Run as a file, importing no package:

    python _guard.py [--private] LAUNCHER_PID -- COMMAND [ARGS...]
    python _guard.py --private --probe          # exit 0 if a private network can be made
    python _guard.py --reap                     # process groups on stdin, killed if it ends

The process asks the kernel for SIGKILL when the thread that started it ends (Linux's
parent-death signal, kept across exec), checks that its launcher is still its parent, and
execs COMMAND in its place (same pid). With `--private` it first enters a new user and network
namespace of its own holding only `lo`, brought up: 127.0.0.1 and ::1, reachable from no other
network namespace, so no other host or user reaches a server bound there to every interface
(TensorFlow 2.21's). No root is needed where the kernel allows unprivileged user namespaces;
ids map onto themselves, so files keep their owner. Nothing outside is reachable from inside
(no DNS, no downloads). Fails with exit code `UNAVAILABLE` and the reason on stderr before
running anything.

The parent-death signal reaches the workers, not processes they started themselves. So the
launcher also starts one reaper, which reads the workers' process groups from a pipe: when the
pipe ends without "done" (the launcher is gone, even SIGKILLed), it SIGKILLs every group,
taking the workers' own children with them.
"""

import ctypes
import errno
import fcntl
import os
import signal
import socket
import struct
import sys

UNAVAILABLE = 75  # EX_TEMPFAIL: no private network here
PRIVATE_NETWORK = "TOWERS_NETNS"  # the namespace made, for `init_workers` to recognize

_CLONE_NEWUSER, _CLONE_NEWNET = 0x10000000, 0x40000000
_PR_SET_PDEATHSIG = 1
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def die_with_parent(parent_pid: int) -> None:
    """SIGKILL to this process when its parent ends; exits now if it already has."""
    if not sys.platform.startswith("linux"):
        return  # no parent-death signal: only a launcher that ends normally stops its workers
    if _libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() != parent_pid:  # it ended before the request: nobody to outlive
        os.kill(os.getpid(), signal.SIGKILL)


def enter_private_network() -> None:
    """Moves this process into a new user and network namespace whose `lo` is up.

    Must run while the process has one thread (before TensorFlow, gRPC or any thread).

    Raises:
      OSError: if the kernel or its policy refuses (EPERM: user namespaces disabled by sysctl,
        AppArmor, seccomp or a container; ENOSPC: user.max_user_namespaces), naming the step.
    """
    if not sys.platform.startswith("linux"):
        raise OSError(errno.ENOSYS, "network namespaces exist on Linux only")
    if len(os.listdir("/proc/self/task")) != 1:
        raise OSError(errno.EINVAL, "threads run already; a private network needs one thread")
    uid, gid = os.geteuid(), os.getegid()
    if _libc().unshare(_CLONE_NEWUSER | _CLONE_NEWNET) != 0:
        number = ctypes.get_errno()
        raise OSError(number, f"unshare(CLONE_NEWUSER | CLONE_NEWNET): {os.strerror(number)}")
    # The capabilities the new user namespace grants last until exec: set it up now. An
    # unprivileged process may map only its own ids, after denying setgroups.
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1")):
        _write(f"/proc/self/{name}", text)
    _write("/proc/self/gid_map", f"{gid} {gid} 1")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        request = struct.pack("16sh14x", b"lo", 0)
        flags = struct.unpack("16sh14x", fcntl.ioctl(probe, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(probe, _SIOCSIFFLAGS, struct.pack("16sh14x", b"lo", flags | _IFF_UP))
    os.environ[PRIVATE_NETWORK] = os.readlink("/proc/self/ns/net")
    os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")  # NCCL's bootstrap: the one interface


def _write(path: str, text: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as error:  # e.g. Ubuntu's kernel.apparmor_restrict_unprivileged_userns=1
        raise OSError(error.errno, f"writing {path}: {error.strerror}") from None


def reap(lines) -> int:
    """SIGKILLs the process groups read from `lines` (one per line) unless "done" comes first."""
    groups = []
    for line in lines:
        if line.strip() == "done":  # the launcher stopped its workers itself
            return 0
        groups.append(int(line))
    for group in groups:  # the launcher is gone: the groups outlive it unless killed now
        try:
            os.killpg(group, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return 0


def main(argv: list[str]) -> int:
    """Parses `argv` as the usage above says, then execs the command (or probes, or reaps)."""
    if argv[1:] == ["--reap"]:
        return reap(sys.stdin)
    options = 0  # the leading options only: the command's own arguments are its own
    while options < 2 and argv[1 + options : 2 + options] in (["--private"], ["--probe"]):
        options += 1
    private, probe = "--private" in argv[1 : 1 + options], "--probe" in argv[1 : 1 + options]
    rest = argv[1 + options :]
    try:
        if private:
            enter_private_network()
    except OSError as error:
        print(f"towers.launch: no private network here: {error}", file=sys.stderr)
        return UNAVAILABLE
    if probe:
        return 0
    if "--" not in rest or rest.index("--") != 1 or len(rest) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    die_with_parent(int(rest[0]))
    os.execv(rest[2], rest[2:])
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv))
