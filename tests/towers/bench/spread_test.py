"""The models suite's targets over several processes (`--rows_from`)."""

import json
import os
import re
import sys

import tensorflow as tf

from tests import forked, test_util
from towers.bench import _spread

_BASE = {"model": "gpt", "dtype": "bfloat16", "tf32": True}


def _row(towers: int, config: str, step_ms: float, **fields) -> dict:
    return {**_BASE, "towers": towers, "config": config, "step_ms": step_ms, **fields}


def _cells(line: str) -> list[str]:
    return re.split(r"\s{2,}", line.strip())


class SpreadTest(tf.test.TestCase):
    def _write(self, name: str, lines: list) -> str:
        path = os.path.join(self.get_temp_dir(), name)
        with open(path, "w", encoding="utf-8") as file:
            for line in lines:
                file.write((line if isinstance(line, str) else json.dumps(line)) + "\n")
        return path

    def _processes(self) -> list[list[dict]]:
        """Three processes at K=2: towers over MirroredStrategy 0.962, 0.900 and 0.940."""
        return [
            [_row(2, "towers replicated xla", 10.0), _row(2, "mirrored xla", 10.4)],
            [_row(2, "towers replicated xla", 9.0), _row(2, "mirrored xla", 10.0)],
            [_row(2, "mirrored xla", 10.0), _row(2, "towers replicated xla", 9.4)],
            [_row(2, "towers replicated xla", 1.0)],  # no peer: no ratio from this one
        ]

    def test_each_ratio_is_taken_within_a_process_then_the_median(self):
        table = _spread.spread_table(self._processes())
        (line,) = [line for line in table.splitlines()[1:] if "MirroredStrategy" in line]
        cells = _cells(line)
        self.assertEqual(cells[4], "0.962 0.900 0.940")
        self.assertEqual(cells[5], "0.940")  # not 9.4 / 10.0 of medians taken across processes
        self.assertEqual(cells[6:], ["0.95", "2/3", "met"])

    def test_a_median_over_the_bound_is_not_met(self):
        processes = self._processes()
        processes[1] = [_row(2, "towers replicated xla", 9.7), _row(2, "mirrored xla", 10.0)]
        (line,) = [line for line in _spread.spread_table(processes).splitlines() if "Mirr" in line]
        self.assertEqual(_cells(line)[5:], ["0.962", "0.95", "1/3", "NOT met"])

    def test_a_ratio_at_the_bound_meets_it(self):
        processes = [[_row(2, "towers replicated xla", 9.5), _row(2, "mirrored xla", 10.0)]]
        (line,) = [line for line in _spread.spread_table(processes).splitlines() if "Mirr" in line]
        self.assertEqual(_cells(line)[5:], ["0.950", "0.95", "1/1", "met"])

    def test_step_times_per_process_and_their_median(self):
        table = _spread.step_times_table(self._processes())
        rows = {_cells(line)[3]: _cells(line)[4:] for line in table.splitlines()[1:]}
        self.assertEqual(rows["towers replicated xla"], ["10.00 9.00 9.40 1.00", "9.20"])
        self.assertEqual(rows["mirrored xla"], ["10.40 10.00 10.00", "10.00"])

    def test_files_are_read_one_process_each_skipping_what_is_not_a_row(self):
        first = self._write("a.jsonl", [
            "bench: a note", _row(2, "mirrored xla", 10.0), '{"config": "cut sh',
            '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}",  # nested past json's recursion
            "[1, 2]", _row(2, "towers replicated xla", 9.0),
        ])  # fmt: skip
        second = self._write("b.jsonl", [_row(1, "one device xla", 5.0)])
        processes = _spread.read_processes([first, second])
        self.assertEqual([len(rows) for rows in processes], [2, 1])
        self.assertEqual(processes[0][1]["step_ms"], 9.0)

    def test_bad_files_are_errors_naming_the_file_and_line(self):
        cases = {
            "empty": ([], ": no rows"),
            "missing": ([_row(2, "x", 1.0), {**_row(2, "x", 1.0), "config": None}], ":2: .*config"),
            "bool": ([_row(True, "x", 1.0)], ":1: .*towers"),
            "text": ([_row(2, "x", "12")], ":1: .*step_ms"),
            "true": ([_row(2, "x", True)], ":1: .*step_ms"),
            "nan": (['{"model": "gpt", "dtype": "bfloat16", "tf32": true, "towers": 2, '
                     '"config": "x", "step_ms": NaN}'], ":1: step_ms must be a positive finite"),
            "infinite": (['{"model": "gpt", "dtype": "bfloat16", "tf32": true, "towers": 2, '
                          '"config": "x", "step_ms": Infinity}'], ":1: step_ms must be"),
            "zero": ([_row(2, "x", 0.0)], ":1: step_ms must be a positive finite"),
        }  # fmt: skip
        for name, (lines, message) in cases.items():
            with self.subTest(name):
                path = self._write(f"{name}.jsonl", lines)
                with self.assertRaisesRegex(ValueError, re.escape(path) + message):
                    _spread.read_processes([path])

    def test_the_program_prints_both_tables(self):
        paths = [self._write(f"p{i}.jsonl", rows) for i, rows in enumerate(self._processes())]
        done = forked.run(
            [sys.executable, "-m", "towers.bench", "--suite=models",
             f"--rows_from={','.join(paths)}"],
            capture_output=True, text=True, timeout=120, env=test_util.child_env(), check=False,
        )  # fmt: skip
        self.assertEqual(done.returncode, 0, done.stderr[-2000:])
        self.assertIn("9.00 9.40 1.00", done.stdout)
        self.assertIn("0.962 0.900 0.940", done.stdout)


if __name__ == "__main__":
    tf.test.main()
