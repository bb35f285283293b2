"""The guard's verdict: whether a step's gradients are finite, decided on the devices.

`judge` checks each copy's gradients on its device and makes the verdict the copies' writes
read: each copy's own, where the copies hold the same all-reduced gradients, or one for all
of them. `towers.step._nonfinite` (the guard's owner) applies it.
"""

import dataclasses
from collections.abc import Callable, Sequence

import tensorflow as tf

from towers.core import canonical_device
from towers.ops.internal import (
    device_scope,
    finite_flags,
    holds,
    host_scope,
    in_programs,
    library_code,
    narrowest,
)
from towers.variables import canonical_name


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Whether a step (or an accumulating call) is finite, and what "raise" says if not.

    Attributes:
      finite: A boolean scalar on the first copy's device; None when nothing is checked.
      mode: "raise", "skip" or None.
      flags: Per copy, a boolean vector: each checked value finite (for the error).
      names: What each flag checked, in order, across the copies.
      ranked: The positions of `names` in the variables' order (for the error).
      copies: With local verdicts, each copy's own verdict on its device (the first is
        `finite`); () when every copy reads `finite`.
      devices: The copies' devices, for `at` (with `copies`).
    """

    finite: tf.Tensor | None
    mode: str | None
    flags: tuple = ()
    names: tuple = ()
    ranked: tuple = ()
    copies: tuple = ()
    devices: tuple = ()

    @property
    def chosen(self) -> tf.Tensor:
        """`finite`, or True when nothing is checked."""
        return tf.constant(True) if self.finite is None else self.finite

    def flat_flags(self) -> tf.Tensor:
        """Every flag in one vector, in `names`' order (built where it is called)."""
        if not self.flags:
            return tf.zeros([0], tf.bool)
        return tf.concat([tf.reshape(flag, [-1]) for flag in self.flags], 0)

    @library_code
    def of(self, copy: int) -> tf.Tensor | None:
        """The verdict copy `copy`'s writes read: its own, on its device, or the one."""
        return self.copies[copy] if self.copies else self.finite

    @library_code
    def at(self, device: str | None) -> tf.Tensor | None:
        """The verdict a write on `device` reads: that device's copy's, or the one."""
        if self.copies and device:
            name = canonical_device(device)
            for copy, on in zip(self.copies, self.devices):
                if canonical_device(on) == name:
                    return copy
        return self.finite


@library_code
def judge(
    per_copy: Sequence[Sequence],
    variables: Sequence[Sequence[tf.Variable]],
    devices: Sequence[str | None],
    mode: str | None,
    rates: Callable[[int], tf.Tensor | None] | None = None,
    elsewhere: Sequence[tf.Tensor] = (),
    compiled: bool = False,
    names_of: Callable[[tf.Variable], str | None] | None = None,
    alike: bool = False,
) -> Verdict:
    """The step's verdict over every copy's gradients, the rate and other processes' shares.

    Each copy's gradients are checked on its device, or (a copy without one: a parameter
    server's) on their variables' devices, one XLA program per device when `compiled`.

    Copies whose gradients are equal by construction (`alike`: `Replicated`'s all-reduced
    gradients, bitwise equal on every copy, no hook between), each holding all of them on a
    device of its own, each judge their own: every device decides from what it holds, and no
    verdict crosses between devices (but the flags of `gather_add`'s buckets, made where the
    buckets are and sent with them: `towers.ops._crossed_flags`). Otherwise (a parameter
    server, sharded state's shares, other processes' shares, a hook's results) the flags
    meet on the first copy's device (or the placer's choice) and every copy reads that one
    verdict, so that a hook that treats copies differently cannot split them.

    Args:
      per_copy: Each copy's gradients (None: not checked).
      variables: Each copy's variables (their checkpoint names go into the error).
      devices: Each copy's device (None: its variables' own).
      mode: "raise", "skip" or None (no check).
      rates: Optional: `rates(copy)`, whether the learning rate copy `copy` reads is finite
        (a boolean scalar, or None: nothing to check), built where it is called.
      elsewhere: Whether gradients other processes hold are finite (boolean scalars).
      compiled: Check each copy's gradients in one XLA program (on a GPU it is one anyway:
        `towers.ops.internal.in_programs`).
      names_of: A variable's checkpoint name, or None (its name without tower scopes).
      alike: Whether the copies' gradients are equal by construction (no hook changed them).
    """
    if mode is None:
        return Verdict(None, None)
    rates = rates or (lambda copy: None)
    if alike and _judged_locally(per_copy, devices, elsewhere):
        return _local(per_copy, variables, devices, mode, rates, compiled, names_of)
    flags, names, each, order = [], [], [], []
    for copy, (grads, copy_variables, device) in enumerate(zip(per_copy, variables, devices)):
        for on, checked in _by_device(grads, copy_variables, device).items():
            values = [g.values if isinstance(g, tf.IndexedSlices) else g for g, _, _ in checked]
            with device_scope(on):
                flags.append(_finite_flags(values, compiled or in_programs(on)))
                each.append(tf.reduce_all(flags[-1]))
            names += _names(checked, names_of)
            order += [(copy, j) for _, _, j in checked]
    rate = rates(0)
    others = ([rate] if rate is not None else []) + list(elsewhere)
    names += (["the learning rate"] if rate is not None else []) + [
        "the gradients of another worker"
    ] * len(elsewhere)
    order += [(len(per_copy), j) for j in range(len(others))]
    with device_scope(next((d for d in devices if d), None)):
        if others:
            flags.append(tf.stack([tf.reshape(flag, []) for flag in others]))
            each.append(tf.reduce_all(flags[-1]))
        finite = tf.reduce_all(tf.stack(each)) if each else tf.constant(True)
    ranked = sorted(range(len(order)), key=order.__getitem__)  # the variables' order
    return Verdict(finite, mode, tuple(flags), tuple(names), tuple(ranked))


def judgeable(
    per_copy: Sequence[Sequence],
    variables: Sequence[Sequence[tf.Variable]],
    devices: Sequence[str | None],
    elsewhere: Sequence[tf.Tensor] = (),
) -> bool:
    """Whether each copy's compiled update can decide its own verdict (`Judged`).

    As `judge`'s local verdicts (copies holding the same gradients, each on a device of its
    own, nothing from other processes; or one copy on its device), with every variable of a
    copy on its device: then the check can be the first part of the copy's one update program.
    """
    return (
        _judged_locally(per_copy, devices, elsewhere, least=1)
        and all(
            holds(device, var.device)
            for copy_variables, device in zip(variables, devices)
            for var in copy_variables
        )
        # One update program per copy: the update groups variables by their device's name,
        # which a v1 graph keeps as written ("/job:localhost/device:CPU:0" or "/device:CPU:0").
        and all(len({var.device for var in copy_variables}) == 1 for copy_variables in variables)
    )


def judged(
    copies: Sequence,
    per_copy: Sequence[Sequence],
    variables: Sequence[Sequence[tf.Variable]],
    devices: Sequence[str],
    mode: str,
    names_of: Callable[[tf.Variable], str | None] | None = None,
) -> Verdict:
    """The verdict the copies' update programs decided (their `Judged`, filled in).

    Each copy's writes read its own; the error's flags and names are the first copy's. For
    "raise", where the first program's flags can be computed from what it reads
    (`Judged.before`: the flags that crossed with the buckets, made before the exchange),
    they are computed on the host, so that its check need not read the program's result (it
    still runs after the updates: see `towers.step._nonfinite`).
    The first copy's suffice: every copy combines the same flags (each device's of its own
    buckets) with a rate of the same value.
    """
    first = copies[0]
    checked = [
        (g, v, j) for j, (g, v) in enumerate(zip(per_copy[0], variables[0])) if g is not None
    ]
    names = _names(checked, names_of) + (["the learning rate"] if first.rate_checked else [])
    finite = tuple(copy.finite for copy in copies)
    ranked = tuple(range(len(names)))
    flags = None
    if mode == "raise" and first.before is not None:
        with host_scope():
            flags = first.before()
    flags = first.flags if flags is None else flags
    return Verdict(finite[0], mode, (flags,), tuple(names), ranked, finite, tuple(devices))


def _judged_locally(
    per_copy: Sequence[Sequence], devices: Sequence, elsewhere: Sequence, least: int = 2
) -> bool:
    """Whether each copy can judge alone.

    At least `least` copies, each on a device of its own, no other process's share to wait
    for, and every copy holding the same gradients (not shares of them).
    """
    if len(per_copy) < least or elsewhere or not all(devices) or len(set(devices)) < len(devices):
        return False
    given = [tuple(g is not None for g in grads) for grads in per_copy]
    return all(pattern == given[0] for pattern in given) and any(given[0])


def _local(per_copy, variables, devices, mode, rates, compiled, names_of) -> Verdict:
    """Each copy's verdict on its own device, from its gradients and its rate.

    The error's flags and names are the first copy's (every copy's are the same).
    """
    copies, flags, names = [], (), []
    for copy, (grads, copy_variables, device) in enumerate(zip(per_copy, variables, devices)):
        (checked,) = _by_device(grads, copy_variables, device).values()  # (all on `device`)
        values = [g.values if isinstance(g, tf.IndexedSlices) else g for g, _, _ in checked]
        rate = rates(copy)
        with device_scope(device):
            mine = [_finite_flags(values, compiled or in_programs(device))]
            if rate is not None:
                mine.append(tf.reshape(rate, [1]))
            copies.append(tf.reduce_all(tf.concat(mine, 0)))
        if copy == 0:
            flags = tuple(mine)
            names = _names(checked, names_of) + (["the learning rate"] if rate is not None else [])
    ranked = tuple(range(len(names)))  # the first copy's, in its variables' order
    return Verdict(copies[0], mode, flags, tuple(names), ranked, tuple(copies), tuple(devices))


def _names(checked: list, names_of: Callable | None) -> list[str]:
    return [(names_of and names_of(v)) or canonical_name(v.name) for _, v, _ in checked]


def _by_device(grads: Sequence, variables: Sequence, device: str | None) -> dict:
    """The (gradient, variable, index) triples to check, by device.

    The copy's device, or (None) each variable's, where its gradient was reduced.
    """
    found: dict[str, list] = {}
    for j, (grad, var) in enumerate(zip(grads, variables)):
        if grad is not None:
            found.setdefault(device or var.device, []).append((grad, var, j))
    return found


def _finite_flags(values: list[tf.Tensor], compiled: bool) -> tf.Tensor:
    """A boolean per tensor: all its values finite."""
    values = [narrowest(v) for v in values]  # (a program's argument: narrowed before it)
    fixed = [i for i, v in enumerate(values) if v.shape.is_fully_defined()]
    if not compiled or not fixed:
        return finite_flags(values, laid_out=False)
    # One XLA program, a few kernels (`finite_flags` lays the tensors out in blocks). Values
    # whose shape changes from step to step (the rows of a sparse gradient, each row once)
    # are checked outside it: XLA would compile it again for each new shape.
    program = tf.function(finite_flags, jit_compile=True, autograph=False)
    inside = program([values[i] for i in fixed])
    if len(fixed) == len(values):
        return inside
    varying = [i for i, v in enumerate(values) if not v.shape.is_fully_defined()]
    outside = finite_flags([values[i] for i in varying], laid_out=False)
    order = fixed + varying  # the value each flag of [inside, outside] is for
    where = sorted(range(len(order)), key=order.__getitem__)  # each value's flag
    return tf.gather(tf.concat([inside, outside], 0), where)
