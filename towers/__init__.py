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
from towers._accumulator import GradientAccumulator
from towers._adagrad import Adagrad
from towers._adam import Adam, AdamW
from towers._apply_reduced import apply_reduced, apply_replicated
from towers._batch_norm import BatchNorm, batch_moments
from towers._checkpoint_manager import CheckpointManager
from towers._cross_tower import cross_tower_sum
from towers._devices import canonical_device, list_devices, session_config, simulate_devices
from towers._evaluate import Evaluation, evaluate
from towers._lamb import LAMB
from towers._lars import LARS
from towers._loss_scale import DynamicLossScale, LossScale
from towers._optimizer import Optimizer
from towers._parameter_server import ParameterServer
from towers._replica_checks import check_replicas_identical
from towers._replicated import Replicated
from towers._rmsprop import RMSProp
from towers._sgd import SGD
from towers._step_timer import StepTimer
from towers._summaries import summary_scalar
from towers._tower_builder import replicate
from towers._tower_context import TowerContext, current_tower
from towers._train_step import tower_gradients, train_step, variable_list
from towers._variable_strategy import ReducedGradients, VariableStrategy, updates_state
from towers._weight_targets import named_variables
from towers._weights_io import RestoreReport, read_weights, restore_weights, save_weights
from towers._worker_all_reduce import WorkersAllReduce
from towers._workers import WorkerInfo, barrier, current_workers, init_workers

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
    "evaluate",
    "init_workers",
    "list_devices",
    "named_variables",
    "ops",
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
