import re
import statistics
import sys

import numpy as np
import tensorflow as tf
from absl.testing import parameterized

from tests import forked, test_util
from towers.bench import _cluster, _state_memory, _tables, _worker

CONFIGURATIONS = {
    "one device",
    "hand-written towers",
    "mirrored strategy",
    "towers ps",
    "towers ps unpacked",
    "towers replicated ring",
    "towers replicated collective",
    "hand-written towers (v1 session)",
    "towers ps (v1 session)",
    "towers ps unpacked (v1 session)",
    "towers replicated ring (v1 session)",
    "towers replicated collective (v1 session)",
}


def _cells(line: str) -> list[str]:
    """A table line's cells: columns are at least two spaces apart, cells never are."""
    return re.split(r"\s{2,}", line.strip())


class WeightsBenchTest(tf.test.TestCase):
    def test_table_for_a_tiny_configuration(self):
        rows = _tables.weights_table(1, 2, 1, self.get_temp_dir())
        self.assertEqual([r[0] for r in rows], ["npz", "h5", "checkpoint"])
        for _, disk_mb, save_s, restore_s, save_rate, restore_rate in rows:
            self.assertAllClose(disk_mb, 1.0, atol=0.05)
            self.assertGreater(save_s, 0)
            self.assertGreater(restore_s, 0)
            self.assertAllClose(save_rate * save_s, 1.0, rtol=1e-6)
            self.assertAllClose(restore_rate * restore_s, 1.0, rtol=1e-6)
        table = _tables.format_table(["format", "disk MB", "save s", "restore s", "a", "b"], rows)
        self.assertLen(table.splitlines(), 4)
        self.assertEqual(_cells(table.splitlines()[3])[0], "checkpoint")


class StateBenchTest(tf.test.TestCase):
    def test_sharded_rows_hold_a_quarter_of_the_state_per_device(self):
        """4 layers of 8x8 + bias on 4 devices: Adam's slots, 1/4 of them on each device."""
        whole, sharded = (
            _state_memory.state_row(test_util.devices(4), s, "adam", 10, 2, layers=4, width=8)
            for s in (False, True)
        )
        slots = 2 * 4 * (8 * 8 + 8) * 4 / 2**20  # two slots, 4 layers, float32, in MiB
        self.assertAllClose(whole["state_mib"], [slots] * 4)
        self.assertAllClose(sharded["state_mib"], [slots / 4] * 4)
        self.assertAllClose(whole["loss"], sharded["loss"], rtol=1e-6)
        table = _state_memory.state_table([whole, sharded], "adam")
        self.assertEqual(_cells(table.splitlines()[3])[:2], ["4", "sharded"])


class StepBenchTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.parameters(("sgd", "--tf32"), ("adam", "--notf32"))
    def test_the_program_prints_one_consistent_row_per_configuration(self, optimizer, tf32):
        """`python -m towers.bench` itself, one model on 2 devices, 4 steps per configuration.
        (Adam's run, for its sharded rows, takes one algorithm.)"""
        algorithms = "ring,collective" if optimizer == "sgd" else "ring"
        out = test_util.run_python(
            "import runpy, sys\n"
            "sys.argv = ['towers.bench', '--models=mlp', '--towers=2', '--steps=2', "
            f"'--warmup=1', '--algorithms={algorithms}', '--batch_size=64', '--trace_builds=1', "
            f"'--optimizer={optimizer}', '{tf32}']\n"
            "runpy.run_module('towers.bench', run_name='__main__')\n",
            timeout=300,
        )
        on = "on" if tf32 == "--tf32" else "off"
        self.assertIn(f"Devices: /device:CPU:0 ... /device:CPU:1; TensorFloat-32 {on}.", out)
        lines = out.splitlines()
        header = _cells(lines[0])
        self.assertEqual(
            header,
            [
                "model",
                "K",
                "configuration",
                "step ms",
                "examples/s",
                "trace s",
                "x one device",
                "x mirrored",
                "all-reduces",
                "state KiB/dev",
                "loss",
            ],
        )
        step_lines = lines[1 : lines.index("")]  # the targets' table follows a blank line
        rows = [dict(zip(header, _cells(line))) for line in step_lines if _cells(line)[0] == "mlp"]
        expected = set(CONFIGURATIONS)
        if optimizer != "sgd":  # state to shard; no mirrored row, one algorithm
            expected -= {"mirrored strategy"}
            expected -= {c for c in CONFIGURATIONS if "collective" in c}
            expected |= {
                "towers replicated ring sharded",
                "towers replicated ring sharded (v1 session)",
            }
        self.assertLen(rows, len(expected))  # one row each, none twice
        by_config = {row["configuration"]: row for row in rows}
        self.assertEqual(set(by_config), expected)
        self.assertIn(f"rule: {optimizer})", out)
        one = float(by_config["one device"]["step ms"])
        mirrored = float(by_config.get("mirrored strategy", {}).get("step ms", "nan"))
        losses = [float(row["loss"]) for row in rows]
        for row in rows:
            step_ms = float(row["step ms"])
            self.assertEqual(row["K"], "2")
            self.assertGreater(step_ms, 0)
            self.assertGreater(float(row["trace s"]), 0)
            self.assertAllClose(float(row["examples/s"]), 64 / step_ms * 1e3, rtol=0.01)
            self.assertAllClose(float(row["x one device"]), one / step_ms, rtol=0.01, atol=0.01)
            if optimizer == "sgd":
                self.assertAllClose(
                    float(row["x mirrored"]), mirrored / step_ms, rtol=0.01, atol=0.01
                )
            else:
                self.assertEqual(row["x mirrored"], "-")
        # Same weights, data and steps: every configuration trained the same model. Near 0 a
        # float32 cross-entropy carries ~1e-6 relative round-off from the reduction order, so
        # the comparison means something only while the loss is well away from 0.
        self.assertGreater(losses[0], 0.05)
        np.testing.assert_allclose(losses, losses[0], rtol=2e-6)
        self.assertEqual(by_config["towers replicated ring"]["all-reduces"], "1")  # one bucket
        self.assertEqual(by_config["towers replicated ring (v1 session)"]["all-reduces"], "1")
        self.assertEqual(by_config["towers ps"]["all-reduces"], "-")
        if optimizer != "sgd":  # Adam's 2 slots of the MLP's 407 K weights, half on each device
            whole = float(by_config["towers replicated ring"]["state KiB/dev"])
            self.assertAllClose(whole, 2 * 4 * (784 * 512 + 512 + 512 * 10 + 10) / 1024, rtol=1e-3)
            share = float(by_config["towers replicated ring sharded"]["state KiB/dev"])
            self.assertLess(share, whole)
        # The targets: towers' fastest row against the hand-written loop, run the same way.
        at = next(i for i, line in enumerate(lines) if _cells(line)[:3] == ["model", "K", "run by"])
        targets = [dict(zip(_cells(lines[at]), _cells(line))) for line in lines[at + 1 : at + 3]]
        for target, suffix in zip(targets, ("", " (v1 session)")):
            self.assertEqual(target["run by"], "v1 session" if suffix else "tf.function")
            ours = {
                name: float(row["step ms"])
                for name, row in by_config.items()
                if name.startswith("towers ") and name.endswith(suffix)
                if suffix or not name.endswith(")")
            }
            named = ours["towers " + target["towers' best"] + suffix]
            self.assertEqual(named, min(ours.values()))  # (ties print alike)
            hand = float(by_config["hand-written towers" + suffix]["step ms"])
            self.assertAllClose(float(target["ratio"]), named / hand, rtol=0.02, atol=0.01)
            if abs(named / hand - 0.9) > 0.01:  # (a printed 0.90 may be 0.904 or 0.896)
                self.assertEqual(target["<= 0.9"], "yes" if named / hand <= 0.9 else "no")
            # The printed trace times are rounded to 0.01 s: the ratio lies within their bounds.
            ours_s = float(by_config["towers ps" + suffix]["trace s"])
            hand_s = float(by_config["hand-written towers" + suffix]["trace s"])
            low = (ours_s - 0.005) / (hand_s + 0.005)
            high = (ours_s + 0.005) / max(hand_s - 0.005, 1e-3)
            self.assertBetween(float(target["trace ratio (ps)"]), low - 0.005, high + 0.005)

    def test_nccl_rows_only_where_nccl_can_run(self):
        """On CPUs and on logical GPUs of one GPU the benchmark leaves `nccl` out."""
        self.assertEqual(_worker.runnable(["nccl", "ring"], test_util.devices(2)), ["ring"])
        self.assertEqual(_worker.runnable(["ring"], test_util.devices(2)), ["ring"])

    def test_interleaved_timing_runs_each_step_alike_in_shuffled_rounds(self):
        calls = []

        def step_of(label, loss):
            def step(data):
                calls.append(label)
                return loss + data

            return step

        steps = {name: step_of(name, loss) for name, loss in (("a", 1.0), ("b", 2.0), ("c", 3.0))}
        record = {}
        timed = _worker.time_interleaved(steps, 0.5, steps=6, warmup=2, record=record)
        self.assertEqual(sorted(record), ["a", "b", "c"])
        for label, seconds in record.items():
            self.assertLen(seconds, 6)  # the timed steps alone
            self.assertEqual(timed[label][1], statistics.median(seconds))
        self.assertEqual(calls[:9], ["a"] * 3 + ["b"] * 3 + ["c"] * 3)  # first call, warm-up
        rounds = [tuple(calls[i : i + 3]) for i in range(9, len(calls), 3)]
        self.assertLen(rounds, 6)
        for order in rounds:
            self.assertCountEqual(order, "abc")  # one call of each per round
        self.assertGreater(len(set(rounds)), 1)  # the order changes between rounds
        losses = {label: t[2] for label, t in timed.items()}
        self.assertEqual(losses, {"a": 1.5, "b": 2.5, "c": 3.5})
        for first, median, _ in timed.values():
            self.assertGreater(first, 0)
            self.assertGreater(median, 0)

    def test_the_profile_suite_splits_op_time_at_the_towers(self):
        out = test_util.run_python(
            "import runpy, sys\n"
            "sys.argv = ['towers.bench', '--suite=profile', '--models=mlp', '--towers=2', "
            "'--steps=1', '--warmup=0', '--algorithms=ring', '--batch_size=64']\n"
            "runpy.run_module('towers.bench', run_name='__main__')\n",
            timeout=300,
        )
        lines = out.splitlines()
        header = _cells(lines[0])
        self.assertEqual(
            header[:9],
            ["model", "K", "configuration", "step ms", "towers op ms", "waits op ms"]
            + ["rest op ms", "rest %", "rest ops"],
        )
        rows = {_cells(line)[2]: dict(zip(header, _cells(line))) for line in lines[1:5]}
        self.assertEqual(
            set(rows),
            {"hand-written towers", "towers ps", "towers ps unpacked", "towers replicated ring"},
        )
        for row in rows.values():
            inside, rest = float(row["towers op ms"]), float(row["rest op ms"])
            self.assertGreater(inside, 0)
            self.assertGreater(rest, 0)
            self.assertGreaterEqual(float(row["waits op ms"]), 0)
            # The share is of the unrounded times; the table prints each to 0.01 ms (a rest of
            # 0.08 ms is 0.075-0.085), so the share lies within what the printed times allow.
            low = 100 * (rest - 0.005) / (inside + rest)
            high = 100 * (rest + 0.005) / (inside + rest)
            self.assertBetween(float(row["rest %"]), low - 0.005, high + 0.005)
        # Outside the towers: at least an add and an update per variable (4 in the MLP), per
        # copy for the replicated one (2).
        self.assertGreaterEqual(int(rows["hand-written towers"]["rest ops"]), 8)
        self.assertGreaterEqual(int(rows["towers replicated ring"]["rest ops"]), 2 * 8)

    _imported_then_run = None

    def _import_then_run_with_a_bad_flag(self):
        """One process for two tests (each process imports TensorFlow: seconds): it imports
        `towers` and `towers.bench`, prints the flags defined, then runs the program as
        `python -m towers.bench --suite=bogus` would. (The completed process, made once.)"""
        if StepBenchTest._imported_then_run is None:
            code = (
                "import runpy, sys\n"
                "from absl import flags\n"
                "import towers\n"
                "assert 'towers.bench' not in sys.modules, 'import towers imported the bench'\n"
                "import towers.bench\n"
                "print(sorted(n for n in flags.FLAGS if n in ('suite', 'models', 'towers')))\n"
                "sys.stdout.flush()\n"
                "sys.argv = ['towers.bench', '--suite=bogus']\n"
                "runpy.run_module('towers.bench', run_name='__main__')\n"
            )
            StepBenchTest._imported_then_run = forked.run(
                [sys.executable, "-c", code],
                capture_output=True,
                text=True,
                timeout=120,
                env=test_util.child_env(),
                check=False,
            )
        return StepBenchTest._imported_then_run

    def test_import_defines_no_flags_and_towers_does_not_import_it(self):
        done = self._import_then_run_with_a_bad_flag()
        self.assertNotIn("imported the bench", done.stderr)
        self.assertEqual(done.stdout.strip(), "[]", done.stderr[-2000:])

    def test_bad_flag_is_an_error(self):
        done = self._import_then_run_with_a_bad_flag()
        self.assertEqual(done.stdout.strip(), "[]", done.stderr[-2000:])  # it got that far
        self.assertNotEqual(done.returncode, 0)
        self.assertIn("suite", done.stderr)
        self.assertIn("bogus", done.stderr)


class WorkersBenchTest(tf.test.TestCase):
    def test_the_table_gives_ratios_to_multi_worker_mirrored(self):
        """The chief's rows as `python -m towers.bench --suite=workers` prints them."""
        base = {"workers": 2, "devices_per_worker": 1}
        rows = [
            {**base, "peer": "multi_worker_mirrored", "model": "mlp", "step_ms": 20.0,
             "trace_s": 0.5, "loss": 2.5},
            {**base, "peer": "multi_worker_mirrored", "model": "all-reduce", "kb": 4,
             "step_ms": 2.0, "mb_per_s": 1.95},
            {**base, "peer": "towers local_first", "model": "mlp", "step_ms": 16.0,
             "trace_s": 0.3, "loss": 2.5},
            {**base, "peer": "towers local_first", "model": "all-reduce", "kb": 4,
             "step_ms": 4.0, "mb_per_s": 0.98},
        ]  # fmt: skip
        lines = _cluster.workers_table(rows).splitlines()
        header = _cells(lines[0])
        table = [dict(zip(header, _cells(line))) for line in lines[1:5]]
        self.assertEqual([r["what"] for r in table], ["mlp", "all-reduce 4 KB"] * 2)
        self.assertEqual([r["x mirrored"] for r in table], ["1.00", "1.00", "1.25", "0.50"])
        self.assertEqual(table[2]["loss"], "2.5")
        self.assertIn("2 workers on loopback", lines[5])

    def test_a_bad_role_is_refused(self):
        with self.assertRaisesRegex(ValueError, "--cluster_role must be one of"):
            _cluster.run_cluster_worker("horovod:2", ["mlp"], 0, 1, 0, [4])


if __name__ == "__main__":
    tf.test.main()
