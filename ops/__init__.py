"""Pure graph ops for data-parallel training: split, merge and gradient aggregation.

They know nothing of towers, training or files, and work inside `tf.function` and in a
`tf.compat.v1.Graph` alike. Per-tower values are lists indexed by tower; tower gradients are
`K x N` lists (towers x variables) aligned with one list of variables.
"""

from ops._grad_lists import merge_grad_list, split_grad_list
from ops._gradients import average_gradients
from ops._merge import MODES, merge_outputs
from ops._split import shard_sizes, split_batch

__all__ = [
    "MODES",
    "average_gradients",
    "merge_grad_list",
    "merge_outputs",
    "shard_sizes",
    "split_batch",
    "split_grad_list",
]
