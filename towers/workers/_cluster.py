"""Several workers (processes, hosts) on TensorFlow's multi-client collective runtime.

Every worker runs the same program; its towers stay on its own devices, and only collectives
span workers. `init_workers` reads the cluster from `TF_CONFIG`, configures collectives (a
leader, so that groups resolve) and the coordination service (heartbeats, so that a dead or
frozen worker becomes an error on the others), starts this worker's server and waits for every
worker. TensorFlow exports no public call for this start-up (`MultiWorkerMirroredStrategy`
makes it as a side effect); the private calls used are pinned by a version test.
"""

import dataclasses
import json
import os
from typing import Any

import tensorflow as tf

from towers.ops.internal import check_number, library_code
from towers.workers._rendezvous import check_exposure, meet

LEADER = "/job:{job}/replica:0/task:0"


@dataclasses.dataclass(frozen=True)
class WorkerInfo:
    """Which worker this process is.

    Attributes:
      index: This worker's index, 0 to `num_workers - 1`.
      num_workers: How many workers the cluster has.
      job: The job name of the workers ("worker"), or "localhost" alone.
      target: Where this worker's v1 sessions connect: `tf.compat.v1.Session(info.target,
        config=towers.session_config())` runs v1 graphs whose collectives span the workers
        ("grpc://host:port", this worker's own server); "" alone (an in-process session).
    """

    index: int = 0
    num_workers: int = 1
    job: str = "localhost"
    target: str = ""

    @property
    def is_chief(self) -> bool:
        """Whether this is worker 0: it writes checkpoints and leads the collectives."""
        return self.index == 0


# The cluster this process joined: process-wide, as TensorFlow's runtime it configures.
_joined: list[WorkerInfo] = []


@library_code
def current_workers() -> WorkerInfo:
    """The cluster this process joined with `init_workers`, or one worker alone.

    Returns:
      A `WorkerInfo`.
    """
    return _joined[0] if _joined else WorkerInfo()


@library_code
def init_workers(
    *,
    heartbeat_seconds: float = 5.0,
    startup_timeout_seconds: float = 300.0,
) -> WorkerInfo:
    """Joins the cluster `TF_CONFIG` describes; without `TF_CONFIG`, one worker alone.

    Call it first thing in `main()` (after `towers.simulate_devices` on machines without
    GPUs), before any op runs. It starts this worker's server, makes worker 0 the leader of
    collectives and of the coordination service, which declares a worker dead when it misses
    heartbeats for `heartbeat_seconds` (every other worker's next collective then fails with
    an error, never a hang), and waits until every worker has joined. Afterwards
    `towers.list_devices()` returns this worker's devices only.

    `TF_CONFIG` is TensorFlow's convention, e.g. for worker 1 of 2:
    `{"cluster": {"worker": ["host0:2222", "host1:2222"]}, "task": {"type": "worker",
    "index": 1}}`; `python -m towers.launch --workers=N script.py` sets it on one machine.

    Args:
      heartbeat_seconds: How long a silent worker may stay silent before the others fail.
      startup_timeout_seconds: How long to wait for every worker to join.

    Returns:
      This worker's `WorkerInfo` (index, count, chief).

    Raises:
      ValueError: for a `TF_CONFIG` that is not JSON, has no "worker" job, or whose task is
        not one of its workers; an argument out of range; or `TF_GRPC_REUSE_PORT` set.
      OSError: if this worker's port is in use (EADDRINUSE, naming the port).
      TimeoutError: if a worker does not come up within `startup_timeout_seconds` (late,
        frozen before its server started, or dead), naming it.
      RuntimeError: if TensorFlow already initialized its runtime, or another cluster was
        joined before.
    """
    for label, value in (
        ("heartbeat_seconds", heartbeat_seconds),
        ("startup_timeout_seconds", startup_timeout_seconds),
    ):
        check_number(value, label, above=0.0)
    cluster, job, index = _read_tf_config(os.environ.get("TF_CONFIG"))
    if cluster is None:
        return current_workers()
    info = WorkerInfo(index, len(cluster[job]), job, f"grpc://{cluster[job][index]}")
    if _joined:
        if _joined[0] == info:
            return info
        raise RuntimeError(f"This process already joined a cluster as {_joined[0]}.")
    check_exposure()
    meet(cluster[job], index, startup_timeout_seconds)  # before TensorFlow, which waits for ever
    _start(cluster, info, heartbeat_seconds, startup_timeout_seconds)
    _joined.append(info)
    barrier("towers_init_workers", startup_timeout_seconds)
    return info


@library_code
def barrier(name: str, timeout_seconds: float = 300.0) -> None:
    """Waits until every worker reaches the barrier `name` (nothing to wait for alone).

    End a program with one, so that no worker exits while a peer still needs it.

    Args:
      name: The barrier's name: the same on every worker, new for each barrier.
      timeout_seconds: How long to wait.

    Raises:
      tf.errors.DeadlineExceededError: if a worker did not arrive in time.
      tf.errors.UnavailableError: if a worker died.
    """
    if current_workers().num_workers > 1:
        _context().wait_at_barrier(name, int(timeout_seconds * 1000))


def local_devices(devices: list[Any]) -> list[Any]:
    """Those of `devices` (logical devices of `tf.config`) that belong to this worker."""
    info = current_workers()
    if info.num_workers == 1:
        return devices
    mine = []
    for device in devices:
        spec = tf.DeviceSpec.from_string(device.name)
        if spec.job in (None, "localhost") or (spec.job == info.job and spec.task == info.index):
            mine.append(device)
    return mine


def _read_tf_config(text: str | None) -> tuple[dict | None, str, int]:
    """(cluster, job, index) from `TF_CONFIG`; (None, ...) when it is unset or empty."""
    if not text:
        return None, "localhost", 0
    try:
        config = json.loads(text)
        cluster, task = config.get("cluster") or {}, config.get("task") or {}
        job, index = task.get("type", "worker"), task.get("index", 0)
    except (ValueError, AttributeError):
        raise ValueError(
            f"TF_CONFIG must be JSON with 'cluster' and 'task'; got {text!r}."
        ) from None
    if job not in cluster or not isinstance(cluster[job], list) or not cluster[job]:
        raise ValueError(
            f"TF_CONFIG's cluster must list the {job!r} job's addresses; got {cluster!r}. Every "
            "worker of the cluster goes in one job, e.g. {'worker': ['host0:2222', ...]}."
        )
    if set(cluster) != {job}:
        raise ValueError(
            f"towers runs every worker in one job; TF_CONFIG's cluster has {sorted(cluster)}."
        )
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(cluster[job]):
        raise ValueError(
            f"TF_CONFIG's task index must be in [0, {len(cluster[job])}); got {index!r}."
        )
    return cluster, job, index


def _context() -> Any:
    from tensorflow.python.eager import context  # noqa: PLC0415  (no public export)

    return context.context()


def _start(
    cluster: dict, info: WorkerInfo, heartbeat_seconds: float, startup_seconds: float
) -> None:
    """Configures collectives and coordination, then starts this worker's server."""
    from tensorflow.core.protobuf import tensorflow_server_pb2  # noqa: PLC0415

    ctx = _context()
    if ctx._initialized:  # noqa: SLF001  (the runtime can be configured only before it starts)
        raise RuntimeError(
            "towers.init_workers must run before TensorFlow initializes its runtime: call it "
            "first thing in main() (after towers.simulate_devices), before any op or "
            "towers.list_devices()."
        )
    leader = LEADER.format(job=info.job)
    ctx.configure_collective_ops(
        collective_leader=leader,
        scoped_allocator_enabled_ops=("CollectiveReduce",),
        device_filters=(f"/job:{info.job}/task:{info.index}",),
    )
    ctx.configure_coordination_service(
        service_type="standalone",
        service_leader=leader,
        heartbeat_timeout_in_ms=int(heartbeat_seconds * 1000),
        cluster_register_timeout_in_ms=int(startup_seconds * 1000),
    )
    spec = tf.train.ClusterSpec(cluster)
    port = int(spec.task_address(info.job, info.index).rsplit(":", 1)[1])
    server_def = tensorflow_server_pb2.ServerDef(
        cluster=spec.as_cluster_def(),
        default_session_config=ctx.config,
        job_name=info.job,
        task_index=info.index,
        protocol="grpc",
        port=port,
    )
    ctx.enable_collective_ops(server_def)
    ctx.ensure_initialized()
