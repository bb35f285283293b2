"""Workers meet before TensorFlow starts: every port up in time, or a clear error.

TensorFlow 2.21 joins a cluster inside one call that holds the interpreter and waits for
ever for a worker that never comes (its register timeout does not bound the leader), and its
"Could not start gRPC server" names no port. So each worker first listens on its own port
with a plain socket (an address in use is named at once), and connects to every peer's port
until all answer or `timeout_seconds` pass; only then does TensorFlow start, on the same
port. A peer that is late, frozen before its server started, or dead is an error within the
timeout. TensorFlow's server listens on every interface without authentication; the check
here says so when the process is not in the private network of `towers.launch`.
"""

import contextlib
import errno
import os
import socket
import time

from absl import logging

from towers.workers._guard import PRIVATE_NETWORK  # set by the launcher: the namespace it made

_POLL_SECONDS = 0.1


def meet(addresses: list[str], index: int, timeout_seconds: float) -> None:
    """Listens on `addresses[index]`'s port until every other address accepts a connection.

    Args:
      addresses: Every worker's "host:port", in worker order.
      index: This worker's index.
      timeout_seconds: How long to wait for the others.

    Raises:
      OSError: if this worker's port is in use (EADDRINUSE), naming it.
      TimeoutError: naming the workers that did not come up in time.
    """
    port = int(addresses[index].rsplit(":", 1)[1])
    with _listening(port, index):
        deadline = time.monotonic() + timeout_seconds
        pending = {i: a for i, a in enumerate(addresses) if i != index}
        while True:
            pending = {i: a for i, a in pending.items() if not _answers(a)}
            if not pending:
                return
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"Worker {index} waited {timeout_seconds:g} s "
                    f"(init_workers(startup_timeout_seconds=)) for worker(s) "
                    f"{', '.join(f'{i} at {a}' for i, a in pending.items())}, which did not "
                    "come up: not started, frozen before its server started, or dead. Start "
                    "every worker (python -m towers.launch does), or wait longer."
                )
            time.sleep(_POLL_SECONDS)


@contextlib.contextmanager
def _listening(port: int, index: int):
    """A plain listener on `port` (every interface, as TensorFlow's), closed at the end."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC's own
    try:
        listener.bind(("", port))
    except OSError as error:
        listener.close()
        if error.errno != errno.EADDRINUSE:
            raise
        raise OSError(
            errno.EADDRINUSE,
            f"Port {port} of worker {index} (TF_CONFIG) is in use by another process; free it "
            "or give this worker another port (python -m towers.launch picks free ones).",
        ) from None
    listener.listen(64)
    try:
        yield
    finally:
        listener.close()


def _answers(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=1.0).close()
    except OSError:
        return False
    return True


def check_exposure() -> None:
    """Refuses a shared port; warns when TensorFlow's server will be reachable from outside.

    Raises:
      ValueError: if `TF_GRPC_REUSE_PORT` is set: another process could share the port.
    """
    if os.environ.get("TF_GRPC_REUSE_PORT", "").lower() in ("1", "true"):
        raise ValueError(
            "TF_GRPC_REUSE_PORT lets another process of this user bind the worker's port and "
            "take its connections; towers refuses it. Unset it."
        )
    if os.environ.get(PRIVATE_NETWORK) == _network_namespace():
        return  # python -m towers.launch's private network: only its processes reach it
    outside = [name for _, name in socket.if_nameindex() if name != "lo"]
    if outside:
        logging.warning(
            "TensorFlow's worker server listens on every interface (%s included) without "
            "authentication: whoever reaches its port can run any op in this worker. Run "
            "only on a network that lets nobody else in (docs/workers.md).",
            ", ".join(outside),
        )


def _network_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/net")
    except OSError:
        return ""
