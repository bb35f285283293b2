"""Input staged on the devices: each tower's shard of the next batch copied while a step runs.

A step fed from the host waits for its batch to cross to the devices before any tower starts.
`prefetch_to_devices` keeps one batch ahead: the batch is split on the CPU and each shard held
in a variable on its tower's device; a step reads its shards there and, in the same step,
fetches, splits and copies the next batch, which no tower waits for (TF1's StagingArea,
tensorpack's StagingInput and `tf.distribute`'s distributed datasets do the same).
"""

import contextlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

import towers.ops as ops
from towers.core import canonical_device, check_devices_exist, device_list
from towers.data._transfer import read_on, sent
from towers.ops.internal import has_kernel, host_scope, library_code


class StagedInput:
    """A `tf.data` pipeline whose next batch waits on the devices, split into shards.

    Made by `towers.prefetch_to_devices`. Pass it to `train_step` as the inputs (each call
    takes one batch) or call `take()`; iterate over it to stop when the data ends:

        staged = towers.prefetch_to_devices(dataset, devices)
        for batch in staged:        # the same object, while a batch is staged
            step(batch)             # @tf.function: train_step(loss_fn, model, opt, batch, ...)

    Checkpoints keep its place exactly: `CheckpointManager(..., extra={"input": staged})`
    saves the pipeline's position and the staged batch (restored into any number of towers).

    Args:
      dataset: The batches.
      devices: The tower devices.
      split_device: Where batches are split.

    Attributes:
      devices: The tower devices, canonical names.
      iterator: The pipeline's iterator, on the CPU, one batch ahead of the steps.
      element_spec: The dataset's element structure.
    """

    def __init__(self, dataset: tf.data.Dataset, devices: Sequence[str], split_device: str):
        if not isinstance(dataset, tf.data.Dataset):
            raise TypeError(f"`dataset` must be a tf.data.Dataset; got {type(dataset).__name__}.")
        if not tf.executing_eagerly():
            raise ValueError(
                "towers.prefetch_to_devices is made eagerly (TF2), outside tf.function and v1 "
                "graphs; feed a v1 graph with placeholders."
            )
        self.devices = device_list(devices)
        check_devices_exist(self.devices)
        self.element_spec = dataset.element_spec
        self._specs = _checked_specs(self.element_spec)
        _check_batch(self._specs[0], len(self.devices))
        self._split_device = split_device
        with tf.device("/device:CPU:0"):
            self.iterator = iter(dataset)
            self._ready = tf.Variable(False, trainable=False, name="staged_ready")
        self._buffers = [[_buffer(spec, device) for spec in self._specs] for device in self.devices]
        self._stage_next()

    def __iter__(self) -> "StagedInput":
        return self

    def __next__(self) -> "StagedInput":
        """This object while a batch is staged; `StopIteration` when the data has ended."""
        if not bool(self._ready.numpy()):
            raise StopIteration
        return self

    @library_code
    def take(self, *, staging: list | None = None) -> tuple[list[Any], list[int | tf.Tensor]]:
        """This step's shards, read on their devices, and starts staging the next batch.

        Args:
          staging: Optional: a list to which the op that stages the next batch is appended.
            A check that can fail the step (an `Assert`) should wait for it, as `train_step`'s
            "raise" check does: failing beside it, the check would cut the next batch's copy,
            leaving this batch staged again, or the iterator cancelled for good.

        Returns:
          `(shards, sizes)`: one nested shard per device (the dataset's structure), on that
          device, and the shard sizes (the weights of an exact mean).

        Raises:
          tf.errors.InvalidArgumentError: when the step runs after the data ended (its
            assertion; iterate over the `StagedInput` to stop at the end instead).
        """
        with tf.device("/device:CPU:0"):
            check = tf.debugging.Assert(
                self._ready.read_value(),
                [
                    "towers.prefetch_to_devices: the staged input has ended (its data, or a "
                    "batch smaller than the device count, which ends it); no batch is staged. "
                    "Iterate over the StagedInput to stop at its end."
                ],
            )
        shards = []
        for buffers, device, size in zip(self._buffers, self.devices, self._static_sizes()):
            with tf.control_dependencies([check] if check is not None else []):
                leaves = [read_on(buffer, device) for buffer in buffers]
            for leaf, spec in zip(leaves, self._specs):  # every batch has the spec's shape
                leaf.set_shape(tf.TensorShape([size]).concatenate(spec.shape[1:]))
            shards.append(tf.nest.pack_sequence_as(self.element_spec, leaves))
        sizes = [ops.shard_sizes(shard, 1)[0] for shard in shards]
        staged = self._stage_next()
        if staging is not None:
            staging.append(staged)
        return shards, sizes

    def _static_sizes(self) -> list[int | None]:
        """The shard sizes when the dataset's batch size is static (`drop_remainder=True`)."""
        batch = self._specs[0].shape[0]
        if batch is None or batch < len(self.devices):
            return [None] * len(self.devices)
        return ops.shard_sizes(batch, len(self.devices))

    def _stage_next(self) -> Any:
        """Fetches the next batch on the host, splits it and copies each shard to its device.

        A batch with fewer examples than devices (a last batch without `drop_remainder`)
        ends the input: it is not staged, and nothing is after it. So the step that stages
        it still trains its own batch, and no step fails on it.
        """
        with tf.device("/device:CPU:0"):
            optional = self.iterator.get_next_as_optional()

            def stage() -> tf.Tensor:
                leaves = tf.nest.flatten(optional.get_value())
                full = tf.shape(leaves[0])[0] >= len(self.devices)
                return tf.cond(full, lambda: self._put(leaves), lambda: self._mark(False))

            return tf.cond(optional.has_value(), stage, lambda: self._mark(False))

    def _put(self, leaves: list[tf.Tensor]) -> tf.Tensor:
        batch = tf.nest.pack_sequence_as(self.element_spec, leaves)
        shards = ops.split_batch(batch, len(self.devices), device=self._split_device)
        assigned = []
        for buffers, shard in zip(self._buffers, shards):
            for buffer, leaf in zip(buffers, tf.nest.flatten(shard)):
                leaf = sent(leaf, self._split_device, buffer.device)
                with tf.device(buffer.device):  # the device's, or its host's
                    assigned.append(buffer.assign(leaf, read_value=False))
        with tf.control_dependencies([a for a in assigned if a is not None]):
            return self._mark(True)

    def _mark(self, ready: bool) -> tf.Tensor:
        self._ready.assign(ready)
        return tf.constant(ready)

    def staged_arrays(self) -> dict[str, np.ndarray]:
        """The staged batch, for checkpoints.

        Returns:
          Leaf i of the batch (its shards joined) as "i", and whether one is staged, "ready".
        """
        arrays = {"ready": np.asarray(bool(self._ready.numpy()))}
        for i in range(len(self._specs)):
            arrays[str(i)] = np.concatenate([b[i].numpy() for b in self._buffers], axis=0)
        return arrays

    def check_staged(self, arrays: dict[str, Any], where: str) -> None:
        """Refuses saved staged arrays that do not fit this pipeline (nothing assigned).

        Args:
          arrays: As `staged_arrays` returns them, read from a file.
          where: The file, for messages.

        Raises:
          ValueError: naming what is missing or misfits.
        """
        expected = {"ready", *map(str, range(len(self._specs)))}
        if set(arrays) != expected:
            raise ValueError(
                f"{where!r} holds staged input {sorted(arrays)}; this pipeline stages "
                f"{sorted(expected)}: resume with the dataset the run was saved with."
            )
        for i, spec in enumerate(self._specs):
            array = np.asarray(arrays[str(i)])
            if array.dtype != spec.dtype.as_numpy_dtype or not spec.shape.is_compatible_with(
                array.shape
            ):
                raise ValueError(
                    f"{where!r} holds a staged {array.dtype}{list(array.shape)} for leaf {i} of "
                    f"this pipeline's {spec}; resume with the dataset the run was saved with."
                )

    def restore_staged(self, arrays: dict[str, Any]) -> None:
        """Stages a saved batch again, split for this object's devices.

        Args:
          arrays: As `staged_arrays` returns them, checked with `check_staged`.
        """
        leaves = [tf.constant(np.asarray(arrays[str(i)])) for i in range(len(self._specs))]
        if bool(np.asarray(arrays["ready"])):
            self._put(leaves)
        else:
            self._mark(False)


@library_code
def prefetch_to_devices(
    dataset: tf.data.Dataset, devices: Sequence[str], *, split_device: str = "/cpu:0"
) -> StagedInput:
    """Stages `dataset`'s batches on the tower devices, one batch ahead of the steps.

    Each batch is split on `split_device` (`ops.split_batch`: sizes differ by at most one)
    and shard i copied to `devices[i]` while the step before runs, so towers start on data
    already there. The first batch is staged now.

    Args:
      dataset: Batches (nested dense tensors with a leading batch axis). A batch with fewer
        examples than devices (a last batch without `drop_remainder=True`) ends the input
        cleanly: the batches before it are each trained once, it is not.
      devices: The tower devices, those `train_step` gets.
      split_device: Where batches are split.

    Returns:
      A `StagedInput`: pass it as `train_step`'s inputs, iterate over it, save it with
      `CheckpointManager(extra={...})`.

    Raises:
      TypeError: if `dataset` is not a `tf.data.Dataset`, or an element is not dense tensors.
      ValueError: if a device does not exist, an element has a scalar leaf, the batches'
        static size is smaller than the device count, or it is called inside
        `tf.function` or a v1 graph.

    Example:
      >>> staged = towers.prefetch_to_devices(dataset, towers.list_devices())
      >>> for batch in staged:
      ...     loss, _ = step(batch)
    """
    return StagedInput(dataset, devices, canonical_device(split_device))


def _checked_specs(element_spec: Any) -> list[tf.TensorSpec]:
    specs = tf.nest.flatten(element_spec)
    for i, spec in enumerate(specs):
        if not isinstance(spec, tf.TensorSpec):
            raise TypeError(
                f"towers.prefetch_to_devices stages dense tensors; leaf {i} of the dataset's "
                f"elements is a {type(spec).__name__}. Make it dense in the pipeline "
                "(e.g. `ragged.to_tensor()`)."
            )
        if spec.shape.rank == 0:
            raise ValueError(
                f"Every leaf of the dataset's elements needs a leading batch axis; leaf {i} is "
                f"a scalar ({spec}). Batch the dataset first."
            )
    return specs


def _check_batch(spec: tf.TensorSpec, devices: int) -> None:
    """Refuses a dataset whose every batch (a static size) is smaller than the device count."""
    batch = spec.shape[0]
    if batch is not None and batch < devices:
        raise ValueError(
            f"towers.prefetch_to_devices: the dataset's batches hold {batch} examples, fewer "
            f"than the {devices} devices (each tower needs at least one). Batch more examples "
            "or stage on fewer devices."
        )


def _buffer(spec: tf.TensorSpec, device: str) -> tf.Variable:
    """A variable holding one shard of the leaf (any batch size): on `device`, or beside it.

    A GPU holds no variable of some dtypes (int32: TensorFlow keeps those in host memory);
    their shards wait on the GPU's host CPU.
    """
    shape = tf.TensorShape([None]).concatenate(spec.shape[1:])
    empty = [0] + [d if d is not None else 0 for d in spec.shape[1:]]
    held = has_kernel("VarHandleOp", device, dtype=spec.dtype)
    with tf.device(device), contextlib.nullcontext() if held else host_scope():
        return tf.Variable(tf.zeros(empty, spec.dtype), shape=shape, trainable=False)
