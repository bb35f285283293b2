"""The public surface of `towers` and `ops`, and the packaging promises around it."""

import pathlib
import re
import shutil
import subprocess
import sys
import types

import tensorflow as tf

import ops
import towers
from tests import test_util

ROOT = pathlib.Path(__file__).resolve().parent.parent


class PublicApiTest(tf.test.TestCase):
    def test_towers_surface_is_pinned(self):
        self.assertEqual(
            sorted(towers.__all__),
            [
                "CheckpointManager",
                "ParameterServer",
                "Replicated",
                "RestoreReport",
                "SGD",
                "TowerContext",
                "apply_replicated",
                "canonical_device",
                "check_replicas_identical",
                "current_tower",
                "list_devices",
                "named_variables",
                "read_weights",
                "replicate",
                "restore_weights",
                "save_weights",
                "session_config",
                "simulate_devices",
                "tower_gradients",
                "train_step",
                "variable_list",
            ],
        )
        public = {
            n
            for n in dir(towers)
            if not n.startswith("_") and not isinstance(getattr(towers, n), types.ModuleType)
        }
        self.assertEqual(public, set(towers.__all__))

    def test_ops_surface_is_pinned(self):
        self.assertEqual(
            sorted(ops.__all__),
            [
                "ALGORITHMS",
                "AllReduce",
                "Auto",
                "Collective",
                "MODES",
                "Nccl",
                "PackSpec",
                "ReduceBroadcast",
                "Ring",
                "all_reduce_algorithm",
                "all_reduce_gradients",
                "average_gradients",
                "merge_grad_list",
                "merge_outputs",
                "pack",
                "pack_spec",
                "shard_sizes",
                "split_batch",
                "split_grad_list",
                "unpack",
            ],
        )
        self.assertEqual({n for n in dir(ops) if not n.startswith("_")}, set(ops.__all__))

    def test_import_ops_resolves_inside_this_project(self):
        ops_dir = pathlib.Path(ops.__file__).resolve().parent
        towers_dir = pathlib.Path(towers.__file__).resolve().parent
        self.assertEqual(ops_dir.parent, towers_dir.parent)
        self.assertTrue((ops_dir / "_split.py").exists())

    def test_every_public_name_is_documented_and_annotated(self):
        for module in (towers, ops):
            for name in module.__all__:
                obj = getattr(module, name)
                if isinstance(obj, tuple):
                    continue
                self.assertTrue(
                    obj.__doc__ and "\n" in obj.__doc__.strip() or isinstance(obj, type),
                    f"{name} lacks a docstring",
                )
                if callable(obj) and not isinstance(obj, type):
                    self.assertIn("return", obj.__annotations__, f"{name} lacks annotations")

    def test_missing_tensorflow_gives_one_clear_message(self):
        code = (
            "import sys\n"
            "sys.modules['tensorflow'] = None\n"
            "try:\n"
            "    import towers\n"
            "except ImportError as e:\n"
            "    print(e)\n"
        )
        message = test_util.run_python(code)
        self.assertIn("need TensorFlow, which is not installed", message)
        self.assertIn("pip install 'towers[cpu]'", message)
        self.assertIn("pip install 'towers[gpu]'", message)

    def test_library_never_imports_keras(self):
        pattern = re.compile(
            r"^\s*(import keras|from keras|import tf_keras|from tf_keras)|tf\.keras"
        )
        for package in ("towers", "ops"):
            for path in (ROOT / package).glob("*.py"):
                for number, line in enumerate(path.read_text().splitlines(), 1):
                    self.assertIsNone(pattern.search(line), f"{path.name}:{number}: {line}")

    def test_ops_never_imports_towers(self):
        for path in (ROOT / "ops").glob("*.py"):
            self.assertNotRegex(path.read_text(), r"(?m)^\s*(import|from) towers")

    def test_library_has_no_asserts(self):
        for package in ("towers", "ops"):
            for path in (ROOT / package).glob("*.py"):
                self.assertNotRegex(path.read_text(), r"(?m)^\s*assert ", path.name)

    def test_ruff_is_clean(self):
        ruff = shutil.which("ruff") or str(pathlib.Path(sys.executable).parent / "ruff")
        done = subprocess.run(
            [ruff, "check", "--quiet", str(ROOT)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=False,
        )
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)

    def test_ci_runs_exactly_the_readme_test_command(self):
        ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
        command = next(line for line in ci_lines if "pytest" in line)
        self.assertIn(f"\n{command}\n", (ROOT / "README.md").read_text())


if __name__ == "__main__":
    tf.test.main()
