"""How `towers.Replicated` exchanges `tf.IndexedSlices` by default: chosen by its devices."""

from collections.abc import Sequence

from towers.ops._all_reduce.nccl import physical_gpu_of_logical
from towers.ops._tensorflow import tf


def sparse_mode(sparse: str, devices: Sequence[str]) -> str:
    """`sparse` itself, or for "auto" the mode `devices` call for.

    "dense" where every device is a logical GPU of one and the same GPU, one GPU alone
    included: a table's copy stays in that GPU's memory, while gathering rows with each row
    once waits for the host (`tf.unique` reads the number of rows there) and serializes the
    exchange through the first device. On one device nothing is exchanged, but the wait is
    the same, and rows whose number varies keep TensorFlow's kernels in an uncompiled update
    (`towers.ops._programs`), so the non-finite guard copies and chooses the whole table
    beside them and checks every gradient in a program of its own; a dense table is updated
    and judged inside the copy's update program. The cost: a gradient the table's size in
    the GPU's memory (`sparse="gather"` keeps rows). "gather" elsewhere: on CPUs no wait
    crosses a bus, and between GPUs of their own a table costs more to send than its rows.

    Raises:
      ValueError: if `sparse` is none of "auto", "gather" and "dense".
    """
    if sparse not in ("auto", "gather", "dense"):
        raise ValueError(f"`sparse` must be one of ('auto', 'gather', 'dense'); got {sparse!r}.")
    if sparse != "auto":
        return sparse
    return "dense" if _one_gpu(devices) else "gather"


def _one_gpu(devices: Sequence[str]) -> bool:
    """Whether every device is a logical GPU split from one physical GPU."""
    physical, found = physical_gpu_of_logical(), set()
    for device in devices:
        spec = tf.DeviceSpec.from_string(device)
        if spec.device_type != "GPU" or spec.device_index is None:
            return False
        index = spec.device_index
        found.add(physical[index] if index < len(physical) else None)
    return len(found) == 1 and None not in found
