"""Pure graph ops for data-parallel training: split, merge, gradient aggregation, all-reduce.

They know nothing of towers, training or files, and work inside `tf.function` and in a
`tf.compat.v1.Graph` alike. Per-tower values are lists indexed by tower; tower gradients are
`K x N` lists (towers x variables) aligned with one list of variables.
"""

from ops._all_reduce import AllReduce, ReduceBroadcast, Ring
from ops._all_reduce_choice import ALGORITHMS, Auto, all_reduce_algorithm
from ops._all_reduce_native import Collective, Nccl
from ops._grad_lists import merge_grad_list, split_grad_list
from ops._gradients import average_gradients
from ops._merge import MODES, merge_outputs
from ops._packing import PackSpec, pack, pack_spec, unpack
from ops._reduce_gradients import all_reduce_gradients
from ops._split import shard_sizes, split_batch

__all__ = [
    "ALGORITHMS",
    "MODES",
    "AllReduce",
    "Auto",
    "Collective",
    "Nccl",
    "PackSpec",
    "ReduceBroadcast",
    "Ring",
    "all_reduce_algorithm",
    "all_reduce_gradients",
    "average_gradients",
    "merge_grad_list",
    "merge_outputs",
    "pack",
    "pack_spec",
    "shard_sizes",
    "split_batch",
    "split_grad_list",
    "unpack",
]
