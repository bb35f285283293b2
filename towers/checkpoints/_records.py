"""The records of a `CheckpointManager` directory: what makes it describe itself.

Before a save writes a file it writes a pending record naming its files (so even a killed
save's leftovers are provably the manager's), and once they are written it rewrites the record
as complete: that is the commit. Records, not file names, say what is the manager's own;
`checkpoints.json` indexes what is kept, and is rebuilt from the records.
"""

import dataclasses
import json
import os
from typing import NamedTuple

from absl import logging

from towers.checkpoints._files import INDEX, NAME, base_name, managed
from towers.files import atomic_write_text
from towers.weights import whole, written_suffixes

_WRITER = "towers.CheckpointManager"
_LARGEST_RECORD = 1 << 16  # bytes: a record is a few hundred; a larger file is not one


@dataclasses.dataclass(frozen=True)
class Record:
    """One save: a regular checkpoint (weights and state) or a best weights file.

    Attributes:
      kind: "ckpt" or "best".
      step: The step saved.
      serial: 0 for the first save of the step, n for its n-th re-save.
      weights: The weights file's name in the directory.
      state: The state file's name ("" for a best).
      value: The monitored value given to the save, or None.
      monitor: For a best, "min" or "max": what its value is best by.
      complete: False while the save's files are being written.
      owned: Whether a record of the manager names the files (False: found by name alone,
        used read-only, never deleted).
    """

    kind: str
    step: int
    serial: int
    weights: str
    state: str = ""
    value: float | None = None
    monitor: str | None = None
    complete: bool = True
    owned: bool = True

    @property
    def name(self) -> str:
        """The record file's own name."""
        return f"{base_name(self.kind, self.step, self.serial)}.json"

    @property
    def files(self) -> tuple[str, ...]:
        """Every file of the save, the record last."""
        return tuple(f for f in (self.weights, self.state, self.name) if f)


def new_record(kind: str, step: int, serial: int, extension: str, **fields) -> Record:
    """The pending record of a save about to be written."""
    base = base_name(kind, step, serial)
    state = f"{base}.state{extension}" if kind == "ckpt" else ""
    return Record(kind, step, serial, f"{base}.weights{extension}", state, complete=False, **fields)


def write_record(directory: str, record: Record) -> None:
    """Writes `record` to its file, atomically."""
    fields = dataclasses.asdict(record)
    del fields["owned"]
    text = json.dumps({"written_by": _WRITER, **fields}, indent=1) + "\n"
    atomic_write_text(os.path.join(directory, record.name), text)


class Scan(NamedTuple):
    """What a directory holds, by record.

    Attributes:
      usable: Complete saves whose files are whole, oldest first.
      killed: Saves whose record is still pending (killed while written): the manager's own,
        to delete.
      damaged: Complete saves with a file missing, not whole or not a plain file: left as
        they are (never restored, never deleted), for a person to look at.
    """

    usable: list[Record]
    killed: list[Record]
    damaged: list[Record]


def scan(directory: str, *, repair: bool = False) -> Scan:
    """The records in `directory`, sorted into usable, killed and damaged saves.

    Usable saves include those the index lists whose record was lost (with `repair`, their
    records are written again), and, read-only, checkpoints and best weights that no record
    or index names (lost with them) whose files are whole.
    """
    records: dict[tuple, Record] = {}
    names = managed(directory)
    for name, key in names.items():
        if name.endswith(".json"):
            record = _read_record(os.path.join(directory, name))
            if record is not None and (record.kind, record.step, record.serial) == key:
                records[key] = record
    for record in _from_index(directory):
        key = (record.kind, record.step, record.serial)
        if key not in records and _all_whole(directory, record):
            if repair:
                write_record(directory, record)
            records[key] = record
    for record in _unrecorded(directory, names, records):
        records[(record.kind, record.step, record.serial)] = record
    ordered = sorted(records.values(), key=lambda r: (r.step, r.serial))
    usable = [r for r in ordered if r.complete and _all_whole(directory, r)]
    killed = [r for r in ordered if not r.complete]
    return Scan(usable, killed, [r for r in ordered if r.complete and r not in usable])


def _all_whole(directory: str, record: Record) -> bool:
    """Whether every file of `record` (but the record) is whole and no link it did not make."""
    paths = [os.path.join(directory, name) for name in record.files[:-1]]
    return all(not os.path.islink(p) and whole(p) for p in paths)


def _unrecorded(directory: str, names: dict, records: dict) -> list[Record]:
    """Saves (checkpoints: weights and state; bests: weights) that no record names.

    Found by name alone, used read-only and never deleted (`owned=False`); a best's value is
    unknown, so no later save is known to beat it.
    """
    files: dict[tuple, dict[str, str]] = {}
    for name, key in names.items():
        role = NAME.fullmatch(name)["role"]
        if role and key not in records:
            files.setdefault(key, {})[role] = name
    found = []
    for (kind, step, serial), roles in files.items():
        needed = {"weights", "state"} if kind == "ckpt" else {"weights"}
        if needed <= roles.keys():
            record = Record(kind, step, serial, roles["weights"], roles.get("state", ""))
            record = dataclasses.replace(record, owned=False)
            if _names_its_own_files(record) and _all_whole(directory, record):
                found.append(record)
    return found


def _read_record(path: str) -> Record | None:
    """The record in file `path`, or None for a foreign, damaged or forged file."""
    try:
        if os.path.islink(path) or os.path.getsize(path) > _LARGEST_RECORD:
            return None
        with open(path) as f:
            fields = json.load(f)
        if fields.pop("written_by") != _WRITER:
            return None
        record = Record(**fields)
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
    if _names_its_own_files(record):
        return record
    what = f"weights {record.weights!r}, state {record.state!r}"
    logging.warning("Checkpoint record %s names files that are not its own (%s): left alone, "
                    "neither read nor deleted.", path, what)  # fmt: skip
    return None


def _names_its_own_files(record: Record) -> bool:
    """Whether a record read from disk names exactly the files a save of its own writes.

    Files are untrusted input: a record (or index entry) naming "../x", an absolute path or
    another save's file would make the manager read or delete what is not its own.
    """
    fields_ok = (
        record.kind in ("ckpt", "best")
        and type(record.step) is int
        and type(record.serial) is int
        and record.step >= 0
        and record.serial >= 0
        and record.monitor in (None, "min", "max")
        and type(record.complete) is bool
        and (record.value is None or type(record.value) in (int, float))
    )
    if not fields_ok:
        return False
    base = base_name(record.kind, record.step, record.serial)
    for suffix in written_suffixes():
        weights, state = f"{base}.weights{suffix}", f"{base}.state{suffix}"
        if record.weights == weights:
            return record.state == (state if record.kind == "ckpt" else "")
    return False


def _from_index(directory: str) -> list[Record]:
    """The saves `checkpoints.json` lists (towers 0.1 wrote no records: its index has them)."""
    try:
        with open(os.path.join(directory, INDEX)) as f:
            index = json.load(f)
        entries = [("ckpt", c) for c in index["checkpoints"]]
        entries += [("best", index["best"])] if index["best"] else []
        records = []
        for kind, entry in entries:
            match = NAME.fullmatch(entry["weights"])
            serial = int(match["serial"] or 0)
            record = Record(
                kind,
                entry["step"],
                serial,
                entry["weights"],
                entry.get("state", ""),
                entry.get("value"),
                entry.get("monitor"),
            )
            if _names_its_own_files(record):  # else left alone: not provably the manager's
                records.append(record)
        return records
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return []


def write_index(directory: str, checkpoints: list[Record], best: Record | None) -> None:
    """Rewrites `checkpoints.json`: what is kept, for people and tools."""
    index = {
        "checkpoints": [
            {"step": r.step, "weights": r.weights, "state": r.state} for r in checkpoints
        ],
        "best": (
            {
                "step": best.step,
                "value": best.value,
                "weights": best.weights,
                "monitor": best.monitor,
            }
            if best
            else None
        ),
    }
    atomic_write_text(os.path.join(directory, INDEX), json.dumps(index, indent=1) + "\n")


def kept(
    records: list[Record], keep_last: int, monitor: str | None
) -> tuple[list[Record], Record | None]:
    """The last `keep_last` checkpoints (the latest save of each step), and the best.

    The best is the best-valued best record by `monitor` among those of the same monitor (or
    of none recorded, from towers 0.1), unless a later best file lost its record: its value
    is unknown, and it stays the best. None without `monitor`.
    """
    records = [r for r in records if r.complete]
    latest = {r.step: r for r in records if r.kind == "ckpt"}  # sorted: last serial wins
    checkpoints = [latest[step] for step in sorted(latest)][-keep_last:]
    comparable = [
        r
        for r in records
        if r.kind == "best" and r.value is not None and r.monitor in (None, monitor)
    ]
    unknown = [r for r in records if r.kind == "best" and not r.owned]  # its record was lost
    if not monitor or not (comparable or unknown):
        return checkpoints, None
    sign = 1.0 if monitor == "min" else -1.0
    best = min(reversed(comparable), key=lambda r: sign * r.value) if comparable else None
    if unknown and (best is None or unknown[-1].step > best.step):
        return checkpoints, unknown[-1]  # never replaced by a value not known to beat it
    return checkpoints, best


def superseded(records: list[Record], kept_now: list, monitor: str | None) -> list[Record]:
    """The manager's own saves among `records` whose files may go.

    Superseded: a checkpoint not kept (older than the last `keep_last` steps, or re-saved),
    a best beaten by a later one of the same monitor, a save killed before its commit.
    Files no record names (a user's, or found without record) are never deleted.
    """
    comparable = [r for r in records if r.kind == "best" and r.monitor in (None, monitor)]
    return [
        r
        for r in records
        if r.owned
        and r not in kept_now
        and (r.kind == "ckpt" or not r.complete or (monitor and r in comparable))
    ]


def warn_damaged(directory: str, damaged: list[Record]) -> None:
    """Says which saves are damaged (a file lost or replaced): left alone, not restored."""
    for record in damaged:
        lost = [f for f in record.files[:-1] if not os.path.isfile(os.path.join(directory, f))]
        logging.warning(
            "Checkpoint %s of step %d in %s is damaged (%s); it is neither restored nor "
            "deleted: its other files stay as they are.",
            record.name,
            record.step,
            directory,
            f"missing: {', '.join(lost)}" if lost else "a file is not whole or is a link",
        )
