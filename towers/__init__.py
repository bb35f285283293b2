"""Data-parallel training of TensorFlow models on several devices, in graph mode.

Pick devices, split each batch on the CPU, build one tower per device, reduce the tower
gradients (you see and may change them), apply them, merge the outputs:

    devices = towers.list_devices()
    loss, outputs = towers.train_step(loss_fn, model, towers.SGD(0.1), batch, devices)

or the same stages one by one with `ops.split_batch`, `towers.replicate`,
`ops.average_gradients` and `ops.merge_outputs` (`from towers import ops`). Variables live by a
`VariableStrategy`: `ParameterServer` (one copy) or `Replicated` (one copy per device). Weights
are saved and restored under tower-free names with `save_weights`/`restore_weights`, and
`CheckpointManager` keeps the last and the best checkpoints of a run and resumes it with any
number of towers.
"""

from towers import (
    ops,  # first: gives the one clear message when TensorFlow is missing
    schedules,
)
from towers.checkpoints import CheckpointManager
from towers.core import (
    TowerContext,
    canonical_device,
    cross_tower_sum,
    current_tower,
    list_devices,
    session_config,
    simulate_devices,
)
from towers.data import StagedInput, prefetch_to_devices
from towers.layers import BatchNorm, batch_moments, dropout, example_uniform
from towers.optimizers import LAMB, LARS, SGD, Adagrad, Adam, AdamW, Optimizer, RMSProp
from towers.progress import Evaluation, StepTimer, evaluate, summary_scalar
from towers.step import (
    DynamicLossScale,
    GradientAccumulator,
    LossScale,
    apply_reduced,
    apply_replicated,
    replicate,
    tower_gradients,
    train_step,
    variable_list,
)
from towers.variables import (
    ParameterServer,
    ReducedGradients,
    Replicated,
    VariableStrategy,
    check_replicas_identical,
    named_variables,
    updates_state,
)
from towers.weights import RestoreReport, read_weights, restore_weights, save_weights
from towers.workers import WorkerInfo, WorkersAllReduce, barrier, current_workers, init_workers

__all__ = [
    "LAMB",
    "LARS",
    "LossScale",
    "SGD",
    "Adagrad",
    "Adam",
    "AdamW",
    "Optimizer",
    "RMSProp",
    "schedules",
    "BatchNorm",
    "CheckpointManager",
    "DynamicLossScale",
    "Evaluation",
    "GradientAccumulator",
    "ParameterServer",
    "ReducedGradients",
    "StepTimer",
    "Replicated",
    "RestoreReport",
    "StagedInput",
    "TowerContext",
    "VariableStrategy",
    "WorkerInfo",
    "WorkersAllReduce",
    "apply_reduced",
    "apply_replicated",
    "barrier",
    "batch_moments",
    "canonical_device",
    "check_replicas_identical",
    "cross_tower_sum",
    "current_tower",
    "current_workers",
    "dropout",
    "evaluate",
    "example_uniform",
    "init_workers",
    "list_devices",
    "named_variables",
    "ops",
    "prefetch_to_devices",
    "read_weights",
    "replicate",
    "restore_weights",
    "save_weights",
    "session_config",
    "simulate_devices",
    "summary_scalar",
    "tower_gradients",
    "train_step",
    "updates_state",
    "variable_list",
]
