"""A checkpoint's state (optimizer and step), and restoring a checkpoint all or nothing.

Everything is read and checked first, then everything assigned.
"""

from collections.abc import Mapping
from typing import Any

import numpy as np

from towers.checkpoints._iterator_state import (
    MEMBER,
    SPEC_MEMBER,
    check_element_spec,
    element_spec,
    is_iterator,
    iterator_state,
    restore_iterator,
)
from towers.checkpoints._shares import state_elsewhere
from towers.data import StagedInput
from towers.optimizers import Optimizer, is_keras
from towers.step import GradientAccumulator
from towers.variables import Copies, Target, named_variables, variable_copies
from towers.variables import state_copies as copies_keeping_state
from towers.weights import assign_arrays, match_arrays, read_arrays, values_of

STEP = "__step__"
STAGED = "staged"  # "extra/<key>/staged/<leaf>": a StagedInput's batch on the devices


def _iterator_of(target: Any) -> Any:
    """The `tf.data` iterator whose position `target` keeps (itself, or a staged input's)."""
    if isinstance(target, StagedInput):
        return target.iterator
    return target if is_iterator(target) else None


def state_arrays(
    model: Target,
    optimizer: Any,
    extra: Mapping[str, Target],
    step: int,
    session: Any = None,
    shares: Mapping[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """The state file's arrays: the step, the optimizer's state, "extra/<key>/..." state.

    Variables of a v1 graph are read in `session`. `shares`: the state other workers keep
    (sharded across workers), gathered already.
    """
    arrays = {STEP: np.asarray(step, np.int64)}
    copies = state_copies(model, optimizer, extra)
    arrays.update(values_of({name: group[0] for name, group in copies.items()}, session))
    arrays.update(shares or {})
    for key, target in extra.items():
        iterator = _iterator_of(target)
        if iterator is not None:
            arrays[f"extra/{key}/{MEMBER}"] = iterator_state(iterator)
            arrays[f"extra/{key}/{SPEC_MEMBER}"] = element_spec(iterator)
        if isinstance(target, StagedInput):  # the batch the iterator has passed already
            for name, array in target.staged_arrays().items():
                arrays[f"extra/{key}/{STAGED}/{name}"] = array
    return arrays


def state_copies(model: Target, optimizer: Any, extra: Mapping[str, Target]) -> Copies:
    """Every copy of the state a checkpoint keeps besides the weights and the step."""
    copies = {}
    if optimizer is not None:
        copies.update(variable_copies(optimizer_state(model, optimizer)))
    for key, target in extra.items():
        if _iterator_of(target) is not None:  # no variables: its position is saved as bytes
            continue
        if isinstance(target, GradientAccumulator):  # its sums, like slots, follow the model
            target.build(copies_keeping_state(model))
        copies.update({f"extra/{key}/{n}": group for n, group in variable_copies(target).items()})
    return copies


def optimizer_state(model: Target, optimizer: Any) -> Any:
    """The optimizer's state as a weights target, all of it built.

    A towers optimizer builds its state for every copy of the model's variables; a Keras
    optimizer builds its own and is named by its variables' paths.
    """
    if isinstance(optimizer, Optimizer):
        copies = copies_keeping_state(model)  # (sharded: the copies this worker keeps)
        optimizer.build(copies)
    elif is_keras(optimizer):
        if not getattr(optimizer, "built", False):
            optimizer.build([v for v in named_variables(model).values() if v.trainable])
        return _keras_state(optimizer)
    return optimizer


def _keras_state(optimizer: Any) -> dict[str, Any]:
    """A Keras optimizer's variables by path, without the optimizer's own name.

    Paths start with that name ("adam_1/..."), which varies by program. Keras names slots
    after the variables' TensorFlow names, which two variables may share ("beta"); repeats
    get "_1", "_2"... in the optimizer's order, which follows the model's variable order.
    """
    named: dict[str, Any] = {}
    for var in optimizer.variables:
        base = name = var.path.split("/", 1)[-1]
        n = 0
        while name in named:
            n += 1
            name = f"{base}_{n}"
        named[name] = var.value
    return named


def restore_checkpoint(
    model: Target,
    optimizer: Any,
    extra: Mapping[str, Target],
    weights: str,
    state: str,
    step: int,
    *,
    strict: bool,
    session: Any = None,
) -> None:
    """Restores weights, optimizer and extra state, all or nothing.

    Both files are read and verified, the step checked, and every name, shape and dtype
    matched before anything is assigned.

    Raises:
      ValueError: if a file is corrupt or holds another step, or (strict) does not match.
    """
    weight_arrays = read_arrays(weights)
    state_arrays_ = read_arrays(state)
    if STEP not in state_arrays_ or int(state_arrays_[STEP]) != step:
        raise ValueError(f"The state file {state!r} does not hold step {step}.")
    plans = [(variable_copies(model), weight_arrays, weights)]
    copies = state_copies(model, optimizer, extra)
    positions = _iterator_positions(extra, state_arrays_, state, strict=strict)
    staged = _staged_batches(extra, state_arrays_, state, positions)
    if optimizer is not None or extra:  # else the file's state is not looked at
        iterator_members = {f"extra/{key}/{SPEC_MEMBER}" for key, _ in positions.values()}
        iterator_members |= set(positions)
        elsewhere = state_elsewhere(model, optimizer, extra)  # their owners restore them
        saved = {
            k: v
            for k, v in state_arrays_.items()
            if k != STEP
            and k not in iterator_members
            and k not in elsewhere
            and not _is_staged(k, extra)
        }
        plans.append((copies, saved, state))
    reports = [
        match_arrays(copies, arrays, where, strict=strict) for copies, arrays, where in plans
    ]
    _restore_iterators(positions, state_arrays_)  # first: a misfit changes nothing
    for target, arrays in staged:
        target.restore_staged(arrays)
    for (copies, arrays, _), report in zip(plans, reports):
        assign_arrays(copies, arrays, report, session)


def _is_staged(member: str, extra: Mapping[str, Target]) -> bool:
    return any(
        isinstance(target, StagedInput) and member.startswith(f"extra/{key}/{STAGED}/")
        for key, target in extra.items()
    )


def _staged_batches(
    extra: Mapping[str, Target], arrays: Mapping[str, Any], where: str, positions: dict
) -> list[tuple[StagedInput, dict]]:
    """Each staged input whose position is restored, with its saved batch, checked.

    Raises:
      ValueError: if the batch is missing or does not fit the pipeline.
    """
    restored = {key for key, _ in positions.values()}
    found = []
    for key, target in extra.items():
        if not isinstance(target, StagedInput) or key not in restored:
            continue
        prefix = f"extra/{key}/{STAGED}/"
        batch = {k[len(prefix) :]: v for k, v in arrays.items() if k.startswith(prefix)}
        target.check_staged(batch, where)
        found.append((target, batch))
    return found


def _restore_iterators(positions: dict, arrays: Mapping[str, Any]) -> None:
    """Moves every iterator to its saved position, or (on a misfit) none of them.

    Raises:
      ValueError: if a pipeline differs from the one saved; every iterator is back where it
        was.
    """
    for key, iterator in positions.values():
        check_element_spec(iterator, arrays.get(f"extra/{key}/{SPEC_MEMBER}"), key)
    before = {member: iterator_state(iterator) for member, (_, iterator) in positions.items()}
    done = []
    try:
        for member, (key, iterator) in positions.items():
            done.append(member)
            restore_iterator(iterator, arrays[member], key)
    except ValueError:
        for member in done:
            key, iterator = positions[member]
            restore_iterator(iterator, before[member], key)
        raise


def _iterator_positions(
    extra: Mapping[str, Target], arrays: Mapping[str, Any], where: str, *, strict: bool
) -> dict[str, tuple[str, Any]]:
    """The state file's iterator members to restore: member -> (key, iterator).

    Raises:
      ValueError: (strict) if an iterator's position is missing from the file.
    """
    found = {}
    for key, target in extra.items():
        member = f"extra/{key}/{MEMBER}"
        iterator = _iterator_of(target)
        if iterator is None:
            continue
        if member in arrays:
            found[member] = (key, iterator)
        elif strict:
            raise ValueError(
                f"{where!r} holds no input position for extra[{key!r}] (saved without it?); "
                "pass strict=False to restore the rest."
            )
    return found
