"""Saving and restoring plain weights that any single-device program can load."""

import dataclasses
import os

import numpy as np
import tensorflow as tf

from towers.files import as_path
from towers.ops.internal import library_code
from towers.variables import Target, named_variables, variable_copies
from towers.weights._formats import format_of, read_arrays, weights_files_in, write_arrays


@dataclasses.dataclass(frozen=True)
class RestoreReport:
    """What `restore_weights` did.

    Attributes:
      restored: Names whose values were loaded.
      missing: Names of the target that the file lacks.
      unexpected: Names in the file that the target lacks.
      mismatched: One line per name whose shape or dtype differs, file against variable.
    """

    restored: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    unexpected: tuple[str, ...] = ()
    mismatched: tuple[str, ...] = ()

    @property
    def complete(self) -> bool:
        """Whether file and target matched exactly."""
        return not (self.missing or self.unexpected or self.mismatched)


@library_code
def save_weights(target: Target, path: str, *, session: tf.compat.v1.Session | None = None) -> None:
    """Saves the variables of `target` under canonical, tower-free names.

    The suffix picks the format: `.npz`; `.h5` or `.hdf5`; no suffix or `.ckpt` for a
    TensorFlow checkpoint directory readable with `tf.train.load_checkpoint(path)`. A file is
    written under a temporary name, flushed to disk and renamed into place: a crash leaves the
    old file whole. A checkpoint directory is written only if it is new, empty, or written by
    `towers` before; nothing `towers` did not write is ever overwritten or deleted.

    Args:
      target: A `tf.Module` (names are attribute paths), a list of `tf.Variable`s, a dict
        of name to variable, a `towers.Replicated` (its first copy), or a `towers` optimizer.
      path: Where to write.
      session: For variables of a v1 graph, the session holding their values.

    Raises:
      TypeError: if `target` is of another type, or a dtype cannot be held by the format.
      ValueError: if the suffix names no format, a name cannot be held by the formats (empty,
        with "//", a leading or trailing "/"; in .h5 also a name inside another), a list
        target has two variables of one name, or `path` is a directory of someone else's
        files.
    """
    path = as_path(path)
    format_of(path)  # a bad suffix fails before anything is read
    variables = named_variables(target)
    write_arrays(path, _values(variables, session))


@library_code
def restore_weights(
    target: Target, path: str, *, strict: bool = True, session: tf.compat.v1.Session | None = None
) -> RestoreReport:
    """Loads weights saved by `save_weights` (or any file of the same names) into `target`.

    Nothing is reshaped or cast. Strict by default: any missing or unexpected name, or a shape
    or dtype mismatch, raises one error listing all of them, and nothing is assigned. With
    `strict=False` the matching variables are loaded and the report says what was skipped.

    Args:
      target: As for `save_weights`.
      path: A `.npz`, a `.h5` or `.hdf5`, or a TensorFlow checkpoint directory or prefix.
      strict: Whether anything but an exact match is an error.
      session: For variables of a v1 graph, the session to assign them in.

    Returns:
      A `RestoreReport`.

    Raises:
      FileNotFoundError: if `path` does not exist (naming the weights files nearby, if any).
      TypeError: if `target` is of another type than `save_weights` takes.
      ValueError: if the file is corrupt or of another format than its suffix, or (strict) the
        names, shapes or dtypes do not match.
    """
    path = as_path(path)
    copies = variable_copies(target)
    try:
        arrays = read_arrays(path)
    except FileNotFoundError as error:
        directory = path if os.path.isdir(path) else os.path.dirname(path) or "."
        found = weights_files_in(directory)[:4]
        hint = f" Weights files there, newest first: {found}." if found else ""
        raise FileNotFoundError(f"{error}{hint}") from None
    return restore_arrays(copies, arrays, path, strict=strict, session=session)


@library_code
def read_weights(path: str) -> dict[str, np.ndarray]:
    """Every array of a weights file, by name; for inspection and conversion.

    Args:
      path: A `.npz`, a `.h5`, or a TensorFlow checkpoint directory or prefix.

    Returns:
      Name -> numpy array, as saved.

    Raises:
      FileNotFoundError, ValueError: as `restore_weights`.
    """
    return read_arrays(as_path(path))


def restore_arrays(
    copies: dict[str, tuple[tf.Variable, ...]],
    arrays: dict[str, np.ndarray],
    where: str,
    *,
    strict: bool = True,
    session=None,
) -> RestoreReport:
    """Assigns `arrays` to every copy of the same-named variables (see `restore_weights`)."""
    report = match_arrays(copies, arrays, where, strict=strict)
    assign_arrays(copies, arrays, report, session)
    return report


def match_arrays(
    copies: dict[str, tuple[tf.Variable, ...]],
    arrays: dict[str, np.ndarray],
    where: str,
    *,
    strict: bool = True,
) -> RestoreReport:
    """What restoring `arrays` into `copies` would do; assigns nothing.

    Raises:
      ValueError: (strict) listing every missing, unexpected or mismatched name.
    """
    report = _match({name: c[0] for name, c in copies.items()}, arrays)
    if strict and not report.complete:
        raise ValueError(
            f"Weights in {where!r} do not match the target; nothing was restored."
            f"{_describe(report)}\nPass strict=False to load what matches."
        )
    return report


def assign_arrays(
    copies: dict[str, tuple[tf.Variable, ...]],
    arrays: dict[str, np.ndarray],
    report: RestoreReport,
    session=None,
) -> None:
    """Assigns the arrays `report` says match to every copy of their variables."""
    _assign({n: copies[n] for n in report.restored}, arrays, session)


def values_of(variables: dict[str, tf.Variable], session=None) -> dict[str, np.ndarray]:
    """The variables' values as numpy arrays, read eagerly or, for a v1 graph, in `session`.

    Raises:
      ValueError: for variables of a v1 graph without a session.
    """
    return _values(variables, session)


def _values(variables: dict[str, tf.Variable], session) -> dict[str, np.ndarray]:
    if session is not None:
        values = session.run(list(variables.values()))
        return {name: np.asarray(value) for name, value in zip(variables, values)}
    try:
        return {name: np.asarray(var.numpy()) for name, var in variables.items()}
    except NotImplementedError:
        raise ValueError(
            "These variables belong to a v1 graph; pass the session that holds their values: "
            "save_weights(target, path, session=sess)."
        ) from None


def _match(variables: dict[str, tf.Variable], arrays: dict[str, np.ndarray]) -> RestoreReport:
    restored, mismatched = [], []
    for name in variables.keys() & arrays.keys():
        var, array = variables[name], arrays[name]
        if tuple(var.shape) != array.shape or var.dtype.as_numpy_dtype != array.dtype:
            mismatched.append(
                f"{name}: file {array.dtype}{list(array.shape)}, variable "
                f"{var.dtype.name}{var.shape.as_list()}"
            )
        else:
            restored.append(name)
    return RestoreReport(
        restored=tuple(n for n in variables if n in restored),
        missing=tuple(n for n in variables if n not in arrays),
        unexpected=tuple(n for n in arrays if n not in variables),
        mismatched=tuple(sorted(mismatched)),
    )


def _describe(report: RestoreReport) -> str:
    lines = []
    for label, names in (
        ("missing from the file", report.missing),
        ("unexpected in the file", report.unexpected),
        ("shape or dtype mismatch", report.mismatched),
    ):
        lines += [f"\n  {label}: {name}" for name in names]
    return "".join(lines)


def _assign(copies: dict[str, tuple], arrays: dict[str, np.ndarray], session) -> None:
    pairs = [(var, arrays[name]) for name, group in copies.items() for var in group]
    if session is None and pairs and not tf.executing_eagerly():
        raise ValueError(
            "These variables belong to a graph being built (a v1 graph or a tf.function); an "
            "assignment there would only add ops that nothing runs. Restore eagerly, or in a "
            "v1 graph pass the session: restore_weights(target, path, session=sess)."
        )
    if session is None:
        for var, value in pairs:
            var.assign(value)
        return
    # Feeding each initializer's value assigns without adding ops to the user's graph.
    session.run(
        [var.initializer for var, _ in pairs],
        {var.initializer.inputs[1]: value for var, value in pairs},
    )
