"""Input for the towers: `tf.data` batches staged on the tower devices a step ahead.

`prefetch_to_devices(dataset, devices)` splits each batch on the CPU and copies each shard to
its tower's device while the step before runs; `train_step` takes the `StagedInput` as its
inputs and `CheckpointManager` keeps its place.
"""

from towers.data._staged import StagedInput, prefetch_to_devices

__all__ = ["StagedInput", "prefetch_to_devices"]
