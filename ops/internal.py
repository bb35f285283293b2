"""What the rest of `towers` builds on from `towers.ops`, beyond the ops users call.

`from towers.ops import internal`: documented and tested like the rest, for code that builds
tower machinery on `towers.ops` (the `towers` package itself, a library of your own); a
training program needs none of it. It is the one door through which `towers` reaches into
`towers.ops`: no module of `towers` imports a private module of `towers.ops`.

- Collectives (the one owner of their keys and order, see `towers.ops._collectives`): the
  group-key ranges `ALL_REDUCE`, `CROSS_TOWER`, `CROSS_TOWER_WORKERS`, `WORKERS` and
  `WORKER_LEADERS`; `random_group_key`, `derived_group_key`, `derived_instance_key`,
  `trace_count`, `graph_state`; `reduce_on` (a device's collective sum, ordered after its
  previous one) and `outermost_graph`.
- All-reduce pieces: `sum_on` (the sum of K values on one device) and `spread` (one value
  copied to K devices, bitwise equal), `check_all_reduce_options`.
- Owned variables (sharded optimizer state): `owners_by_bytes` (an owner per variable),
  `reduce_to_owners` (each owner its variables' mean gradient, reduce-scattered) and
  `gather_from_owners` (every variable from its owner, all-gathered).
- Weights of a mean: `normalized_weights`, `weight_in`, `accumulation_dtype`, and the types
  `Weight` and `Gradient`.
- Gradients: `densified` (an `IndexedSlices` made dense), `deduplicated` (its rows made
  unique), `check_bucket_bytes`, `packed_arguments` (all-reduced gradients as the terms a
  compiled program adds, scales and unpacks itself, `towers.ops._packed_sum`, with the flags
  each device made of the buckets it sent, `towers.ops._crossed_flags`; and
  `flags_where_made`, those flags combined where they were made, for the host's check),
  `narrow_form`, `narrowest`
  and `HALF` (float32 gradients that are exactly half-precision ones, which exchanges of two
  towers send narrow: `towers.ops._exact_widening`), and `sparse_mode` (`Replicated`'s
  "auto" for `tf.IndexedSlices`: dense on logical GPUs of one GPU, gathered elsewhere).
- The AutoGraph rule: `library_code` marks a function AutoGraph must not convert (every
  public function of `towers` and `towers.ops` carries it, or calls user code through
  `towers.core.user_code_entry`).
- Arguments: `check_int`, `check_number` (finite), `check_bool`: a `TypeError` for a wrong
  type, a `ValueError` for a value out of range, one wording everywhere.
- Control: `update_ops` (the ops in nested update results, for a control dependency),
  `selected` (writes kept or undone by a boolean on the device: the non-finite guard) and
  `finite_flags` (whether each of many tensors is all finite, in a few kernels under XLA),
  and `in_programs` (whether an uncompiled step's update and the guard's pieces run as XLA
  programs on a device: on GPUs).
- Placement: `device_scope` (a device, or the caller's scope for None), `host_scope` (the
  CPU beside the device in scope, for ops without a GPU kernel), `holds` (whether a placement
  is on a device), `in_task` (whether it is in a device's task) and `has_kernel` (whether
  TensorFlow has a kernel for an op and its dtypes on a kind of device).
"""

from towers.ops._all_reduce.transfers import spread, sum_on
from towers.ops._all_reduce_gradients import check_options as check_all_reduce_options
from towers.ops._arguments import check_bool, check_int, check_number
from towers.ops._autograph import library_code
from towers.ops._collectives import (
    ALL_REDUCE,
    CROSS_TOWER,
    CROSS_TOWER_WORKERS,
    WORKER_LEADERS,
    WORKERS,
    derived_group_key,
    derived_instance_key,
    graph_state,
    outermost_graph,
    random_group_key,
    reduce_on,
    trace_count,
)
from towers.ops._device_scope import device_scope, holds, host_scope, in_task
from towers.ops._exact_widening import HALF, narrow_form, narrowest
from towers.ops._finite import finite_flags
from towers.ops._kernels import has_kernel
from towers.ops._owned import gather_from_owners, reduce_to_owners
from towers.ops._ownership import owners_by_bytes
from towers.ops._packed_sum import flags_where_made, packed_arguments
from towers.ops._packing import check_bucket_bytes
from towers.ops._programs import in_programs
from towers.ops._selected import selected
from towers.ops._slices import deduplicated, densified
from towers.ops._sparse_mode import sparse_mode
from towers.ops._tower_grads import Gradient
from towers.ops._updates import update_ops
from towers.ops._weighted_mean import Weight, accumulation_dtype, normalized_weights, weight_in

__all__ = [
    "ALL_REDUCE",
    "CROSS_TOWER",
    "CROSS_TOWER_WORKERS",
    "WORKERS",
    "WORKER_LEADERS",
    "Gradient",
    "HALF",
    "Weight",
    "accumulation_dtype",
    "check_all_reduce_options",
    "check_bool",
    "check_int",
    "check_number",
    "check_bucket_bytes",
    "deduplicated",
    "densified",
    "finite_flags",
    "derived_group_key",
    "derived_instance_key",
    "device_scope",
    "gather_from_owners",
    "graph_state",
    "has_kernel",
    "flags_where_made",
    "holds",
    "in_task",
    "host_scope",
    "in_programs",
    "library_code",
    "narrow_form",
    "narrowest",
    "normalized_weights",
    "outermost_graph",
    "owners_by_bytes",
    "packed_arguments",
    "random_group_key",
    "reduce_on",
    "reduce_to_owners",
    "selected",
    "sparse_mode",
    "spread",
    "sum_on",
    "trace_count",
    "update_ops",
    "weight_in",
]
