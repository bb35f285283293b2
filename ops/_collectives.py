"""Collective ops' keys and order: the one owner that every user of collectives asks.

TensorFlow's collective runtime is process-wide. A group key names one set of devices (across
processes, the same key on every one), an instance key one reduction within a group, and the
collectives of one function must start in the same order on every device, or they wait for
each other for ever. Three users build collectives (`CollectiveAllReduce`, the cross-tower
sums of synchronized BatchNorm, the all-reduces across workers); each asks here for its keys
from a range of its own, and every collective is built through `reduce_on`, which orders it.

Group-key ranges (tf.distribute counts its own from 1, below all of them):

| range | keys for | how |
|---|---|---|
| `CROSS_TOWER_WORKERS` [2**17, 2**17 + 2**16) | cross-tower sums across workers | derived |
| `WORKERS` [2**18, 2**18 + 2**16) | all-reduces across workers | derived |
| `WORKER_LEADERS` [2**18 + 2**16, 2**18 + 2**17) | the same, one device per worker | derived |
| `CROSS_TOWER` [2**19, 2**20) | cross-tower sums in one process | random |
| `ALL_REDUCE` [2**20, 2**31) | `CollectiveAllReduce` | random or given |

"Derived" keys are the same on every worker without talking: from the group's size and the
local devices (`derived_group_key`), and, for instance keys, from what is reduced
(`derived_instance_key`). State of the graph being built (ordering tokens, v1 chains, per-trace
counters) lives in that graph, under `graph_state`.
"""

import contextlib
import random
import zlib
from collections.abc import Iterator

from towers.ops._autograph import library_code
from towers.ops._tensorflow import tf

CROSS_TOWER_WORKERS = range(2**17, 2**17 + 2**16)
WORKERS = range(2**18, 2**18 + 2**16)
WORKER_LEADERS = range(2**18 + 2**16, 2**18 + 2**17)
CROSS_TOWER = range(2**19, 2**20)
ALL_REDUCE = range(2**20, 2**31)

_STATE = "towers.ops.collectives"  # the graph collection that holds each graph's state


def random_group_key(keys: range) -> int:
    """A group key drawn at random from `keys` (one of this module's ranges).

    Args:
      keys: The range of the caller's purpose.

    Returns:
      The key.
    """
    return random.SystemRandom().choice(keys)


def derived_group_key(keys: range, devices: list[str], size: int) -> int:
    """A group key in `keys` that every worker derives alike for its local `devices`.

    From the group's size and the devices' types and indices (not their job or task, which
    differ between workers): two device sets of one worker get different keys.

    Args:
      keys: The range of the caller's purpose.
      devices: This process's devices of the group.
      size: The group's size, every process's devices.

    Returns:
      The key.
    """
    local = ",".join(
        f"{spec.device_type}:{spec.device_index}"
        for spec in map(tf.DeviceSpec.from_string, devices)
    )
    return keys.start + zlib.crc32(f"{size}|{local}".encode()) % len(keys)


def derived_instance_key(signature: str) -> int:
    """An instance key in [1, 2**31) that every worker derives alike from `signature`.

    crc32, since Python's own hash is salted per process.

    Args:
      signature: What identifies the reduction on every worker (its number in the trace,
        shape and dtype).

    Returns:
      The key.
    """
    return 1 + zlib.crc32(signature.encode()) % (2**31 - 1)


def graph_state(name: str) -> dict:
    """A dict kept by the outermost graph being built, one per `name`.

    State of a graph (a function's trace, a v1 graph) dies with it: a retrace starts afresh,
    and two graphs never share tokens or counts.

    Args:
      name: Whose state, e.g. "tokens" or "cross_tower".

    Returns:
      The same dict for the same graph and name.
    """
    kept = outermost_graph(tf.compat.v1.get_default_graph()).get_collection_ref(_STATE)
    if not kept:
        kept.append({})
    return kept[0].setdefault(name, {})


def trace_count(name: str) -> int:
    """1, 2, ...: how many times `name` was counted in the graph being built, this time included.

    Args:
      name: What is counted.

    Returns:
      The count.
    """
    counts = graph_state("counts")
    counts[name] = counts.get(name, 0) + 1
    return counts[name]


@library_code
def reduce_on(
    device: str, value: tf.Tensor, size: int, group: int, instance: int, timeout: float
) -> tf.Tensor:
    """`device`'s `CollectiveReduceV2` (a sum) of `value`, after the device's previous one.

    Inside `tf.function` the device's ordering token orders it; in a v1 graph it waits for
    the device's previous collective of the open `collective_order` block (or the graph's),
    through its input: TensorFlow 2.21 drops control inputs given to a collective op.

    Args:
      device: The device it runs on.
      value: This device's value.
      size: The group's size.
      group: The group key.
      instance: The instance key.
      timeout: Seconds to wait for the group; 0 for ever.

    Returns:
      The sum, on `device`.
    """
    in_function = tf.compat.v1.executing_eagerly_outside_functions()
    chain = None if in_function else _v1_chain()
    with tf.device(device):
        if chain and device in chain:
            with tf.control_dependencies([chain[device]]):
                value = tf.identity(value)
        summed = tf.raw_ops.CollectiveReduceV2(
            input=value,
            group_size=size,
            group_key=group,
            instance_key=instance,
            ordering_token=[_ordering_token(device)] if in_function else [],
            merge_op="Add",
            final_op="Id",
            timeout_seconds=timeout,
        )
    if chain is not None:
        chain[device] = summed.op
    return summed


@library_code
@contextlib.contextmanager
def collective_order() -> Iterator[None]:
    """In a v1 graph, chains the collectives built inside, per device, in build order.

    A unit that is run on its own (one training step, a broadcast of initial values) builds
    its collectives in one block, so that they wait for one another and for no other unit's
    (`train_step` and `all_reduce_gradients` open one; a block inside a block is part of it).
    Outside any block, a v1 graph's collectives form one chain per device. Inside
    `tf.function`, tokens order collectives and this does nothing.

    Yields:
      Nothing.

    Example:
      >>> with tf.Graph().as_default():
      ...     with ops.collective_order():
      ...         summed = ops.CollectiveAllReduce()(values, devices)
    """
    chains = graph_state("v1_chains")
    blocks = chains.setdefault("blocks", [])
    if blocks:  # inside a block: part of it
        yield
        return
    blocks.append({})
    try:
        yield
    finally:
        blocks.pop()


def _v1_chain() -> dict:
    """Device -> the last collective of the open `collective_order` block (or the graph's)."""
    chains = graph_state("v1_chains")
    blocks = chains.setdefault("blocks", [])
    return blocks[-1] if blocks else chains.setdefault("graph", {})


def _ordering_token(device: str) -> tf.Tensor:
    """`device`'s ordering token in the graph being built: an unused resource handle.

    Every collective of a function that takes it is chained, per device, by `tf.function`'s
    automatic control dependencies, in the order the collectives were built; all collectives
    the library builds on a device share it. It lives in the outermost function graph: a
    token of a `tf.cond` branch or loop body would be out of reach of later collectives.
    """
    tokens = graph_state("tokens")
    if device not in tokens:
        graph = outermost_graph(tf.compat.v1.get_default_graph())
        with graph.as_default(), tf.device(device):
            tokens[device] = tf.raw_ops.VarHandleOp(
                dtype=tf.float32, shape=[], shared_name=f"towers_ordering_{len(tokens)}"
            )
    return tokens[device]


def outermost_graph(graph: tf.Graph) -> tf.Graph:
    """The function graph that a `tf.cond` branch or loop body being built belongs to.

    Args:
      graph: The graph being built.

    Returns:
      `graph` itself unless it is nested in another function graph.
    """
    while getattr(graph, "outer_graph", None) is not None and hasattr(
        graph.outer_graph, "outer_graph"
    ):
        graph = graph.outer_graph
    return graph
