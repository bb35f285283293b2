"""Several workers: joining a cluster, all-reduces that span it, the local launcher.

`init_workers` joins the cluster `TF_CONFIG` names (one process per host or per launched
worker); `WorkersAllReduce` sums over every worker's devices; `towers.workers.launch` is
`python -m towers.launch`. The lowest wing: which devices are this process's is asked here.
"""

from towers.workers import launch
from towers.workers._all_reduce import WorkersAllReduce, algorithm_for_workers, broadcast_from_chief
from towers.workers._cluster import (
    WorkerInfo,
    barrier,
    current_workers,
    init_workers,
    local_devices,
)

__all__ = [
    "WorkerInfo",
    "WorkersAllReduce",
    "algorithm_for_workers",
    "barrier",
    "broadcast_from_chief",
    "current_workers",
    "init_workers",
    "launch",
    "local_devices",
]
