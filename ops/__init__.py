"""Pure graph ops for data-parallel training: split, merge, gradient aggregation, all-reduce.

Imported as `from towers import ops`. They know nothing of towers, training or files, and work
inside `tf.function` and in a `tf.compat.v1.Graph` alike. Per-tower values are lists indexed by
tower; tower gradients are `K x N` lists (towers x variables) aligned with one list of
variables. Nothing in this package imports the rest of `towers`.
"""

from towers.ops._all_reduce.auto import AutoAllReduce
from towers.ops._all_reduce.base import AllReduce
from towers.ops._all_reduce.by_name import ALGORITHMS, all_reduce_algorithm
from towers.ops._all_reduce.collective import CollectiveAllReduce
from towers.ops._all_reduce.gather_add import GatherAddAllReduce
from towers.ops._all_reduce.hierarchical import HierarchicalAllReduce
from towers.ops._all_reduce.nccl import NcclAllReduce
from towers.ops._all_reduce.reduce_broadcast import ReduceBroadcastAllReduce
from towers.ops._all_reduce.ring import RingAllReduce
from towers.ops._all_reduce_gradients import all_reduce_gradients
from towers.ops._average_gradients import average_gradients
from towers.ops._collectives import collective_order
from towers.ops._merge import MODES, merge_outputs
from towers.ops._packing import PackSpec, pack, pack_spec, unpack
from towers.ops._split import shard_sizes, split_batch
from towers.ops._tower_grads import merge_grad_list, split_grad_list

__all__ = [
    "ALGORITHMS",
    "MODES",
    "AllReduce",
    "AutoAllReduce",
    "CollectiveAllReduce",
    "GatherAddAllReduce",
    "HierarchicalAllReduce",
    "NcclAllReduce",
    "PackSpec",
    "ReduceBroadcastAllReduce",
    "RingAllReduce",
    "all_reduce_algorithm",
    "all_reduce_gradients",
    "average_gradients",
    "collective_order",
    "merge_grad_list",
    "merge_outputs",
    "pack",
    "pack_spec",
    "shard_sizes",
    "split_batch",
    "split_grad_list",
    "unpack",
]
