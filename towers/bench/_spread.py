"""The models suite's targets over several processes: each process's ratio, and their median.

Each process compiles its programs afresh (XLA's autotuning included), so one process's
ratios are one draw of its programs' speeds: in one run on an H100 (wave 5, session 33) towers
at K=1 took 29.42 ms in one process and 30.94 in the next, beside floors of 28.57 and 28.75.
`.ci/gpu/models.sh` runs a set of configurations several times (`REPEAT=N`, a fresh process
each), and `python -m towers.bench --suite=models --rows_from=a.jsonl,b.jsonl,...` reads
their rows back: every ratio is taken within one process, then the processes' ratios are
summarised. The files are read as untrusted: a line that is not a JSON object is skipped
(the workers' files hold nothing else), and a row without the fields a table needs is an
error naming its file and line.
"""

import json
import math
import statistics
from collections.abc import Sequence

from towers.bench._model_suite import target_ratios, verdict
from towers.bench._tables import format_table

# The fields of a worker's row that the tables read, with their types.
_FIELDS = {
    "model": str,
    "dtype": str,
    "tf32": bool,
    "towers": int,
    "config": str,
    "step_ms": (int, float),
}


def read_processes(paths: Sequence[str]) -> list[list[dict]]:
    """The rows of each file, one process's rows per file (the worker's JSON lines).

    Raises:
      ValueError: a file with no row, or a row without a field the tables need (or with a
        value of the wrong type, or a step time that is not a positive finite number).
    """
    processes = []
    for path in paths:
        rows = []
        with open(path, encoding="utf-8", errors="replace") as file:
            for number, line in enumerate(file, 1):
                if not line.startswith("{"):
                    continue
                try:
                    row = json.loads(line)
                except (json.JSONDecodeError, RecursionError):
                    continue  # (a line cut short by a killed worker, or nested past reading)
                if isinstance(row, dict):
                    rows.append(_checked(row, path, number))
        if not rows:
            raise ValueError(f"{path}: no rows (JSON lines of `--suite=models` workers).")
        processes.append(rows)
    return processes


def _checked(row: dict, path: str, number: int) -> dict:
    for field, kind in _FIELDS.items():
        value = row.get(field)
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            raise ValueError(f"{path}:{number}: a row without a valid {field!r}: {value!r}.")
    if not (math.isfinite(row["step_ms"]) and row["step_ms"] > 0):
        raise ValueError(
            f"{path}:{number}: step_ms must be a positive finite number: {row['step_ms']!r}."
        )
    return row


def spread_table(processes: list[list[dict]]) -> str:
    """Each target's ratio in each process that has both its rows, and their median.

    The verdict is the median's; "held" counts the processes whose own ratio meets the bound.
    """
    ratios: dict[tuple, list[float]] = {}  # (row key, target, its bound) -> each process's
    for rows in processes:
        for key, what, ratio, bound in target_ratios(rows):
            ratios.setdefault((key, what, bound), []).append(ratio)
    lines = []
    for (key, what, bound), values in ratios.items():
        held = "-" if bound is None else f"{sum(v <= bound for v in values)}/{len(values)}"
        median = statistics.median(values)
        lines.append(
            (
                key[0],
                key[1],
                key[3],
                what,
                " ".join(f"{v:.3f}" for v in values),
                f"{median:.3f}",
                "-" if bound is None else bound,
                held,
                verdict(median, bound),
            )
        )
    header = ["model", "dtype", "K", "target", "each process", "median", "bound", "held", ""]
    return format_table(header, lines)


def step_times_table(processes: list[list[dict]]) -> str:
    """Each configuration's step time in each process that ran it, and their median."""
    times: dict[tuple, list[float]] = {}
    for rows in processes:
        for r in rows:
            key = (r["model"], r["dtype"], r["towers"], r["config"])
            times.setdefault(key, []).append(float(r["step_ms"]))
    lines = [
        (*key, " ".join(f"{t:.2f}" for t in values), statistics.median(values))
        for key, values in times.items()
    ]
    header = ["model", "dtype", "K", "configuration", "step ms, each process", "median"]
    return format_table(header, lines)
