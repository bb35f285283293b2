"""The files of a `CheckpointManager` directory: names, self-describing records, a scan.

Each save of step N writes its weights, its state (optimizer and step), then a small JSON
record naming both: the record is the commit, so a directory describes itself and its index
can always be rebuilt. A re-save of step N gets the next serial (`ckpt-0000000N.1.*`), so it
never overwrites the save it replaces.
"""

import contextlib
import dataclasses
import json
import os
import re
import shutil

from towers._atomic_files import atomic_write_text

INDEX = "checkpoints.json"
LOCK = "checkpoints.lock"
EXTENSIONS = {".npz": ".npz", ".h5": ".h5", ".hdf5": ".h5", ".ckpt": ".ckpt", "": ".ckpt"}
_NAME = re.compile(
    r"(?P<kind>ckpt|best)-(?P<step>\d{8,})(?:\.(?P<serial>\d+))?"
    r"\.(?:(?P<role>weights|state)(?:\.npz|\.h5|\.ckpt)?|json)"
)
_WRITER = "towers.CheckpointManager"


@dataclasses.dataclass(frozen=True)
class Record:
    """One committed save: a regular checkpoint (weights and state) or a best weights file.

    Attributes:
      kind: "ckpt" or "best".
      step: The step saved.
      serial: 0 for the first save of the step, n for its n-th re-save.
      weights: The weights file's name in the directory.
      state: The state file's name ("" for a best).
      value: The monitored value given to the save, or None.
    """

    kind: str
    step: int
    serial: int
    weights: str
    state: str = ""
    value: float | None = None

    @property
    def name(self) -> str:
        """The record file's own name."""
        return f"{_base(self.kind, self.step, self.serial)}.json"

    @property
    def files(self) -> tuple[str, ...]:
        """Every file of the save, the record last."""
        return tuple(f for f in (self.weights, self.state, self.name) if f)


def new_record(kind: str, step: int, serial: int, extension: str, value: float | None) -> Record:
    """The record of a save about to be written (its files do not exist yet)."""
    base = _base(kind, step, serial)
    state = f"{base}.state{extension}" if kind == "ckpt" else ""
    return Record(kind, step, serial, f"{base}.weights{extension}", state, value)


def to_json(record: Record) -> str:
    """The record file's content."""
    return json.dumps({"written_by": _WRITER, **dataclasses.asdict(record)}, indent=1) + "\n"


def managed(directory: str) -> dict[str, tuple[str, int, int]]:
    """The names in `directory` of the files a manager writes: name -> (kind, step, serial)."""
    if not os.path.isdir(directory):
        return {}
    found = {}
    for name in os.listdir(directory):
        match = _NAME.fullmatch(name)
        if match:
            found[name] = (match["kind"], int(match["step"]), int(match["serial"] or 0))
    return found


def scan(directory: str) -> list[Record]:
    """The complete saves in `directory`, from their records, and from their files alone.

    A save whose record is lost is still whole when its files are: a checkpoint's state file
    is written (atomically) after its weights, so weights with state are a complete
    checkpoint, and a best weights file is whole once it exists; their monitored value is
    unknown (None). Weights without state are a killed save (a TensorFlow checkpoint
    directory counts once its "checkpoint" state file, written last, exists).
    """
    records, unrecorded = {}, {}
    for name, (kind, step, serial) in managed(directory).items():
        if name.endswith(".json"):
            record = _read_record(os.path.join(directory, name))
            if record is not None and (record.kind, record.step, record.serial) == (
                kind,
                step,
                serial,
            ):
                records[(kind, step, serial)] = record
        else:
            unrecorded.setdefault((kind, step, serial), []).append(name)
    for (kind, step, serial), names in unrecorded.items():
        weights = [n for n in names if ".weights" in n]
        state = [n for n in names if ".state" in n]
        if (kind, step, serial) not in records and weights and (state or kind == "best"):
            records[(kind, step, serial)] = Record(
                kind, step, serial, weights[0], state[0] if state else ""
            )
    complete = [
        r for r in records.values() if all(_whole(os.path.join(directory, f)) for f in r.files[:-1])
    ]
    return sorted(complete, key=lambda r: (r.step, r.serial))


def _whole(path: str) -> bool:
    """Whether a weights or state file (written atomically) or directory is whole.

    A checkpoint directory is whole once its "checkpoint" state file, written last, exists.
    """
    if os.path.isdir(path):
        return os.path.exists(os.path.join(path, "checkpoint"))
    return os.path.exists(path)


def _read_record(path: str) -> Record | None:
    """The record in file `path`, or None for a foreign or damaged file."""
    try:
        with open(path) as f:
            fields = json.load(f)
        fields.pop("written_by")
        return Record(**fields)
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def next_serial(directory: str, kind: str, step: int) -> int:
    """A serial no file of `kind` and `step` uses yet (a killed save's leftovers included)."""
    used = [s for k, st, s in managed(directory).values() if (k, st) == (kind, step)]
    return max(used) + 1 if used else 0


def kept(
    records: list[Record], keep_last: int, monitor: str | None
) -> tuple[list[Record], Record | None]:
    """The last `keep_last` checkpoints (the latest save of each step), and the best.

    The best is the best-valued best record by `monitor`, the latest one without it.
    """
    latest = {r.step: r for r in records if r.kind == "ckpt"}  # sorted: last serial wins
    checkpoints = [latest[step] for step in sorted(latest)][-keep_last:]
    bests = [r for r in records if r.kind == "best"]
    valued = [r for r in bests if r.value is not None]
    if monitor and valued:
        sign = 1.0 if monitor == "min" else -1.0
        return checkpoints, min(reversed(valued), key=lambda r: sign * r.value)
    return checkpoints, (bests[-1] if bests else None)


def write_index(directory: str, checkpoints: list[Record], best: Record | None) -> None:
    """Rewrites `checkpoints.json`: what is kept, for people and tools (records are the truth)."""
    index = {
        "checkpoints": [
            {"step": r.step, "weights": r.weights, "state": r.state} for r in checkpoints
        ],
        "best": {"step": best.step, "value": best.value, "weights": best.weights} if best else None,
    }
    atomic_write_text(os.path.join(directory, INDEX), json.dumps(index, indent=1) + "\n")


def adopt_old_index(directory: str) -> list[Record]:
    """Writes records for the complete saves a towers 0.1 manager listed in its index.

    That version wrote no records: its index holds the monitored values. Without one (lost,
    corrupt) `scan` still finds the saves, without values.
    """
    try:
        with open(os.path.join(directory, INDEX)) as f:
            index = json.load(f)
        entries = [("ckpt", c) for c in index["checkpoints"]]
        entries += [("best", index["best"])] if index["best"] else []
        records = [
            Record(kind, e["step"], 0, e["weights"], e.get("state", ""), e.get("value"))
            for kind, e in entries
        ]
    except (OSError, ValueError, TypeError, KeyError):
        return []
    complete = [
        r for r in records if all(os.path.exists(os.path.join(directory, n)) for n in r.files[:-1])
    ]
    for record in complete:
        atomic_write_text(os.path.join(directory, record.name), to_json(record))
    return sorted(complete, key=lambda r: (r.step, r.serial))


def remove(path: str) -> None:
    """Removes a checkpoint file or TensorFlow checkpoint directory."""
    with contextlib.suppress(OSError):
        if os.path.isdir(path):
            shutil.rmtree(path)
        else:
            os.remove(path)


def latest_checkpoint_file(directory: str) -> str | None:
    """The weights file of the highest step in `directory`, or None; for error messages."""
    records = [r for r in scan(directory) if r.kind == "ckpt"] if os.path.isdir(directory) else []
    return os.path.join(directory, records[-1].weights) if records else None


def _base(kind: str, step: int, serial: int) -> str:
    return f"{kind}-{step:08d}" + (f".{serial}" if serial else "")
