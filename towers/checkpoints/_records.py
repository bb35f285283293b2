"""The records of a `CheckpointManager` directory: what makes it describe itself.

Before a save writes a file it writes a pending record naming its files (so even a killed
save's leftovers are provably the manager's), and once they are written it rewrites the record
as complete: that is the commit. Records, not file names, say what is the manager's own;
`checkpoints.json` indexes what is kept, and is rebuilt from the records.
"""

import dataclasses
import json
import os

from towers.checkpoints._files import INDEX, NAME, base_name, managed
from towers.files import atomic_write_text
from towers.weights import whole

_WRITER = "towers.CheckpointManager"


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


def scan(directory: str, *, repair: bool = False) -> tuple[list[Record], list[Record]]:
    """The records in `directory`: (complete saves, the rest: killed or half-removed saves).

    Complete saves include those the index lists whose record was lost (with `repair`, their
    records are written again), and, read-only, checkpoints whose weights and state are whole
    but no record or index names (a record lost with the index).
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
        if key not in records and all(whole(os.path.join(directory, f)) for f in record.files[:-1]):
            if repair:
                write_record(directory, record)
            records[key] = record
    for record in _unrecorded_checkpoints(directory, names, records):
        records[(record.kind, record.step, record.serial)] = record
    ordered = sorted(records.values(), key=lambda r: (r.step, r.serial))
    usable = [
        r
        for r in ordered
        if r.complete and all(whole(os.path.join(directory, f)) for f in r.files[:-1])
    ]
    return usable, [r for r in ordered if r not in usable]


def _unrecorded_checkpoints(directory: str, names: dict, records: dict) -> list[Record]:
    """Checkpoints (weights with state, both whole) that no record names, found read-only."""
    files: dict[tuple, dict[str, str]] = {}
    for name, (kind, step, serial) in names.items():
        role = NAME.fullmatch(name)["role"]
        if kind == "ckpt" and role and (kind, step, serial) not in records:
            files.setdefault((kind, step, serial), {})[role] = name
    return [
        Record(kind, step, serial, found["weights"], found["state"], owned=False)
        for (kind, step, serial), found in files.items()
        if {"weights", "state"} <= found.keys()
        and all(whole(os.path.join(directory, f)) for f in found.values())
    ]


def _read_record(path: str) -> Record | None:
    """The record in file `path`, or None for a foreign or damaged file."""
    try:
        with open(path) as f:
            fields = json.load(f)
        if fields.pop("written_by") != _WRITER:
            return None
        return Record(**fields)
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


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
            records.append(
                Record(
                    kind,
                    int(entry["step"]),
                    serial,
                    entry["weights"],
                    entry.get("state", ""),
                    entry.get("value"),
                    entry.get("monitor"),
                )
            )
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
    of none recorded, from towers 0.1); None without `monitor`.
    """
    records = [r for r in records if r.complete]
    latest = {r.step: r for r in records if r.kind == "ckpt"}  # sorted: last serial wins
    checkpoints = [latest[step] for step in sorted(latest)][-keep_last:]
    comparable = [
        r
        for r in records
        if r.kind == "best" and r.value is not None and r.monitor in (None, monitor)
    ]
    if not monitor or not comparable:
        return checkpoints, None
    sign = 1.0 if monitor == "min" else -1.0
    return checkpoints, min(reversed(comparable), key=lambda r: sign * r.value)


def latest_checkpoint_file(directory: str) -> str | None:
    """The weights file of the highest step in `directory`, or None; for error messages."""
    if not os.path.isdir(directory):
        return None
    checkpoints = [r for r in scan(directory)[0] if r.kind == "ckpt"]
    return os.path.join(directory, checkpoints[-1].weights) if checkpoints else None
