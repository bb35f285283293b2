"""Where variables live and what they are called: variable strategies and names.

A `VariableStrategy` places the variables a tower creates, says which copy each tower
reads and turns the towers' gradients into updates: `ParameterServer` (one copy) and
`Replicated` (one copy per device). Names are the model's structure without tower scopes
(Keras layers recognized by what they provide), the names weight files and optimizer state
use.
"""

from towers.variables._deferred import (
    DeferredUpdate,
    defer_state_update,
    deferred_state_updates,
    defers_state_updates,
)
from towers.variables._names import CopiedState, Copies, canonical_name
from towers.variables._parameter_server import ParameterServer
from towers.variables._replica_checks import check_replicas_identical
from towers.variables._replicated import Replicated
from towers.variables._state_variable import state_variable
from towers.variables._strategy import ReducedGradients, VariableStrategy, updates_state
from towers.variables._targets import Target, named_variables, state_copies, variable_copies

__all__ = [
    "CopiedState",
    "DeferredUpdate",
    "Copies",
    "ParameterServer",
    "ReducedGradients",
    "Replicated",
    "Target",
    "VariableStrategy",
    "canonical_name",
    "check_replicas_identical",
    "defer_state_update",
    "deferred_state_updates",
    "defers_state_updates",
    "named_variables",
    "state_copies",
    "state_variable",
    "updates_state",
    "variable_copies",
]
