"""The public surface of `towers` and `towers.ops`, and the packaging promises around it."""

import ast
import dataclasses
import importlib.util
import inspect
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import types
import zipfile

import absl
import numpy as np
import tensorflow as tf

import towers
from tests import test_util
from towers import ops

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = {"towers": ROOT / "towers", "towers.ops": ROOT / "ops"}

TOWERS_NAMES = [
    "Adagrad",
    "Adam",
    "AdamW",
    "BatchNorm",
    "CheckpointManager",
    "DynamicLossScale",
    "Evaluation",
    "GradientAccumulator",
    "LAMB",
    "LARS",
    "LossScale",
    "Optimizer",
    "RMSProp",
    "ParameterServer",
    "ReducedGradients",
    "Replicated",
    "RestoreReport",
    "SGD",
    "StagedInput",
    "StepTimer",
    "TowerContext",
    "VariableStrategy",
    "WorkerInfo",
    "WorkersAllReduce",
    "apply_reduced",
    "apply_replicated",
    "barrier",
    "batch_moments",
    "canonical_device",
    "check_replicas_identical",
    "cross_tower_sum",
    "current_tower",
    "current_workers",
    "dropout",
    "evaluate",
    "example_uniform",
    "init_workers",
    "list_devices",
    "named_variables",
    "ops",
    "prefetch_to_devices",
    "read_weights",
    "replicate",
    "restore_weights",
    "save_weights",
    "schedules",
    "session_config",
    "simulate_devices",
    "summary_scalar",
    "tower_gradients",
    "train_step",
    "updates_state",
    "variable_list",
]
SCHEDULES_NAMES = [
    "Constant",
    "CosineDecay",
    "ExponentialDecay",
    "LinearWarmup",
    "PiecewiseConstant",
    "Schedule",
]
OPS_NAMES = [
    "ALGORITHMS",
    "AllReduce",
    "AutoAllReduce",
    "CollectiveAllReduce",
    "GatherAddAllReduce",
    "HierarchicalAllReduce",
    "MODES",
    "NcclAllReduce",
    "PackSpec",
    "ReduceBroadcastAllReduce",
    "RingAllReduce",
    "all_reduce_algorithm",
    "all_reduce_gradients",
    "average_gradients",
    "collective_order",
    "merge_grad_list",
    "merge_outputs",
    "pack",
    "pack_spec",
    "shard_sizes",
    "split_batch",
    "split_grad_list",
    "unpack",
]


def documentation_problems(name: str, obj) -> list[str]:
    """What a public function or class lacks: docstrings, Google sections, annotations.

    A class is checked with every method, property and `__call__`/`__init__` it defines itself
    (inherited ones are checked where they are defined). A method that overrides one of a
    base class may leave its Args and Returns to the base's docstring.
    """
    if isinstance(obj, type):
        problems = _class_problems(name, obj)
        for attr, member in vars(obj).items():
            if attr.startswith("_") and attr not in ("__call__", "__init__"):
                continue
            overrides = any(attr in vars(base) for base in obj.__mro__[1:] if base is not object)
            if isinstance(member, property):
                problems += _docstring_problems(f"{name}.{attr}", member.fget, sections=False)
                problems += _annotation_problems(f"{name}.{attr}", member.fget)
            elif isinstance(member, (staticmethod, classmethod)):
                problems += _function_problems(f"{name}.{attr}", member.__func__, overrides)
            elif inspect.isfunction(member) or hasattr(member, "__wrapped__"):
                problems += _function_problems(f"{name}.{attr}", member, overrides)
        return problems
    if callable(obj):
        return _function_problems(name, obj)
    return []


def _class_problems(name: str, cls: type) -> list[str]:
    doc = inspect.cleandoc(vars(cls).get("__doc__") or "")  # its own, not inherited
    if not doc or doc.startswith(f"{cls.__name__}("):  # dataclass's generated signature
        return [f"{name} lacks a docstring"]
    init = vars(cls).get("__init__")
    if dataclasses.is_dataclass(cls):
        fields = [f.name for f in dataclasses.fields(cls)]
        return _undescribed(name, doc, "Attributes:", fields)
    if init is None:
        return []
    params = [p for p in inspect.signature(init).parameters if p != "self"]
    return _undescribed(name, doc, "Args:", params)


def _function_problems(name: str, fn, overrides: bool = False) -> list[str]:
    if name.endswith(".__init__"):  # documented in the class docstring
        return _annotation_problems(name, fn, returns=False)
    return _docstring_problems(name, fn, sections=not overrides) + _annotation_problems(name, fn)


def _docstring_problems(name: str, fn, sections: bool = True) -> list[str]:
    doc = inspect.cleandoc(fn.__doc__ or "")
    if not doc or not doc.splitlines()[0].strip():
        return [f"{name} lacks a docstring"]
    if not sections:
        return []
    signature = inspect.signature(fn)
    params = [p for p in signature.parameters if p not in ("self", "cls")]
    problems = _undescribed(name, doc, "Args:", params)
    returns = signature.return_annotation
    if returns not in (None, "None", inspect.Signature.empty) and not (
        "Returns:" in doc or "Yields:" in doc
    ):
        problems.append(f"{name}'s docstring lacks Returns:")
    return problems


def _undescribed(name: str, doc: str, section: str, params: list[str]) -> list[str]:
    """Problems if `params` are not each described in the docstring's `section`."""
    if not params:
        return []
    if section not in doc:
        return [f"{name}'s docstring lacks {section}"]
    body = re.split(r"\n\S[^\n]*:\n", doc.split(section, 1)[1] + "\n", maxsplit=1)[0]
    return [
        f"{name}'s {section} does not describe `{p}`"
        for p in params
        if not re.search(rf"(?m)^\s+\**{re.escape(p)}( \(.*\))?:", body)
    ]


def _annotation_problems(name: str, fn, returns: bool = True) -> list[str]:
    signature = inspect.signature(fn)
    problems = [
        f"{name} lacks an annotation for `{p.name}`"
        for p in signature.parameters.values()
        if p.name not in ("self", "cls") and p.annotation is inspect.Parameter.empty
    ]
    if returns and signature.return_annotation is inspect.Signature.empty:
        problems.append(f"{name} lacks a return annotation")
    return problems


def _python_files(package: str) -> list[pathlib.Path]:
    return sorted(p for p in PACKAGES[package].rglob("*.py") if "__pycache__" not in p.parts)


def _imported_modules(path: pathlib.Path) -> list[str]:
    """Every module a file imports, absolute; relative imports resolved against `towers.ops`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            found.append(f"towers.ops.{base}" if node.level else base)
    return found


def _run_script(directory: str, script: str) -> str:
    """Runs `script` as a file in `directory`, as a user would, without the repo on the path."""
    path = os.path.join(directory, "main.py")
    with open(path, "w") as f:
        f.write(script)
    env = {**os.environ, "PYTHONPATH": test_util.SITE}  # (tests/site: no module of the repo's)
    done = subprocess.run(
        [sys.executable, path],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode:
        raise AssertionError(f"script failed:\n{done.stderr[-3000:]}")
    return done.stdout


class PublicSurfaceTest(tf.test.TestCase):
    def test_towers_surface_is_pinned(self):
        self.assertEqual(sorted(towers.__all__), sorted(TOWERS_NAMES))
        public = {
            n
            for n in dir(towers)
            if not n.startswith("_") and not isinstance(getattr(towers, n), types.ModuleType)
        }
        self.assertEqual(public | {"ops", "schedules"}, set(towers.__all__))
        self.assertIs(towers.ops, ops)

    def test_schedules_surface_is_pinned(self):
        self.assertEqual(sorted(towers.schedules.__all__), SCHEDULES_NAMES)

    def test_ops_surface_is_pinned(self):
        self.assertEqual(sorted(ops.__all__), sorted(OPS_NAMES))
        # `ops.internal` is the one named door for towers' own use, outside `__all__`.
        public = {n for n in dir(ops) if not n.startswith("_")} - {"internal"}
        self.assertEqual(public, set(ops.__all__))

    def test_every_public_name_is_documented_and_annotated(self):
        problems = []
        for module in (towers, ops, towers.schedules):
            for name in module.__all__:
                problems += documentation_problems(name, getattr(module, name))
        self.assertEqual(problems, [])

    def test_the_documentation_check_catches_what_it_should(self):
        class Undocumented:
            def method(self, x: int) -> int:
                """Doubles.

                Args:
                  x: A number.

                Returns:
                  2 x.
                """
                return 2 * x

        class Documented:
            """A class.

            Args:
              y: Something.
            """

            def __init__(self, y):
                self.y = y

            def method(self, x) -> int:
                """Doubles, without sections."""
                return 2 * x

            @property
            def size(self):
                return 1

        def bare(x: int):
            return x

        def half_described(x: int, y: int) -> int:
            """Adds, see `bare`.

            Args:
              x: A number.

            Returns:
              The sum.
            """
            return x + y

        self.assertEqual(documentation_problems("U", Undocumented), ["U lacks a docstring"])
        self.assertEqual(
            documentation_problems("D", Documented),
            [
                "D.__init__ lacks an annotation for `y`",
                "D.method's docstring lacks Args:",
                "D.method's docstring lacks Returns:",
                "D.method lacks an annotation for `x`",
                "D.size lacks a docstring",
                "D.size lacks a return annotation",
            ],
        )
        self.assertEqual(
            documentation_problems("bare", bare),
            ["bare lacks a docstring", "bare lacks a return annotation"],
        )
        self.assertEqual(
            documentation_problems("half", half_described), ["half's Args: does not describe `y`"]
        )


class PackagingTest(tf.test.TestCase):
    def test_ops_is_towers_ops(self):
        """(That no top-level `ops` is imported, installed or in a checkout whose root has
        one: the next two tests' processes.)"""
        self.assertEqual(ops.__name__, "towers.ops")
        self.assertEqual(pathlib.Path(ops.__file__).resolve().parent, ROOT / "ops")
        self.assertNotIn("ops", sys.modules)

    def test_a_users_ops_module_beside_the_script_changes_nothing(self):
        script = (
            "import ops\n"
            "import towers\n"
            "from towers import ops as tops\n"
            "import tensorflow as tf\n"
            "print(ops.MARK, tops.__name__, tops.split_batch(tf.range(4), 2)[1].numpy().tolist())\n"
            "import sys\n"  # nothing of towers imported a top-level `ops` (the user's: no dots)
            "print(sorted(m for m in sys.modules if m.startswith('ops.')))\n"
        )
        for layout in ("module", "package"):
            with tempfile.TemporaryDirectory() as directory:
                if layout == "module":
                    path = os.path.join(directory, "ops.py")
                else:
                    os.mkdir(os.path.join(directory, "ops"))
                    path = os.path.join(directory, "ops", "__init__.py")
                with open(path, "w") as f:
                    f.write(f"MARK = 'users-{layout}'\n")
                out = _run_script(directory, script)
                self.assertEqual(out.split(), [f"users-{layout}", "towers.ops", "[2,", "3]", "[]"])

    def test_a_source_checkout_imports_its_own_ops(self):
        """`python -m towers.launch` in the repository's root imports the checkout's towers,
        whose `ops` is the root's (installing puts it in the package)."""
        # Where TensorFlow and what it imports live (one site-packages, or several: the GPU
        # machine's kit adds TensorFlow beside the image's own packages).
        found = {os.path.dirname(os.path.dirname(m.__file__)) for m in (tf, np, absl)}
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sorted(found))}
        env["TF_CPP_MIN_LOG_LEVEL"] = "3"
        env.pop("PYTHONSAFEPATH", None)  # the root must come first on sys.path, as with -m
        code = (
            "import importlib.util, towers\n"
            "print(importlib.util.find_spec('towers.tests'))\n"
            "print(towers.__file__)\nprint(towers.ops.__file__)\n"
            "import sys\n"  # the root's `ops` folder stays unimported
            "print(sorted(m for m in sys.modules if m == 'ops' or m.startswith('ops.')))\n"
        )
        done = subprocess.run(  # -S: no site, so no editable-install finder either
            [sys.executable, "-S", "-c", code],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        self.assertEqual(done.returncode, 0, done.stderr[-2000:])
        lines = done.stdout.strip().splitlines()
        self.assertEqual(lines[-4], "None")  # the root's other folders stay out of the package
        self.assertEqual(lines[-1], "[]")
        package, package_ops = (pathlib.Path(p).resolve() for p in lines[-3:-1])
        self.assertEqual((package.parent, package_ops.parent), (ROOT / "towers", ROOT / "ops"))
        # Nothing else of the root becomes part of the package, there or here.
        for name in ("towers.tests", "towers.setup", "towers.examples"):
            self.assertIsNone(importlib.util.find_spec(name), name)

    def test_ops_imports_nothing_else_of_towers(self):
        for path in _python_files("towers.ops"):
            for module in _imported_modules(path):
                if module == "towers" or module.startswith("towers."):
                    self.assertTrue(
                        module.startswith("towers.ops"), f"{path.name} imports {module}"
                    )

    def test_the_wheel_holds_the_towers_package_alone(self):
        with tempfile.TemporaryDirectory() as directory:
            source = os.path.join(directory, "src")
            os.mkdir(source)
            for name in ("setup.py", "pyproject.toml", "README.md"):
                shutil.copy(ROOT / name, source)
            for folder in ("towers", "ops"):
                shutil.copytree(
                    ROOT / folder,
                    os.path.join(source, folder),
                    ignore=shutil.ignore_patterns("__pycache__"),
                )
            subprocess.run(
                [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
                + ["-w", os.path.join(directory, "dist"), source],
                check=True,
                capture_output=True,
                timeout=240,
            )
            (wheel,) = pathlib.Path(directory, "dist").glob("*.whl")
            names = zipfile.ZipFile(wheel).namelist()
        self.assertTrue(wheel.name.startswith("tf_towers-"), wheel.name)
        top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
        self.assertEqual(top, {"towers"})
        packaged = {n for n in names if n.endswith(".py")}
        expected = {f"towers/{p.relative_to(ROOT / 'towers')}" for p in _python_files("towers")}
        expected |= {
            f"towers/ops/{p.relative_to(ROOT / 'ops')}" for p in _python_files("towers.ops")
        }
        self.assertEqual(packaged, expected)

    def test_missing_tensorflow_gives_one_clear_message(self):
        code = (
            "import sys\n"
            "sys.modules['tensorflow'] = None\n"
            "try:\n"
            "    import towers\n"
            "except ImportError as e:\n"
            "    print(e)\n"
        )
        message = test_util.run_python(code, fresh=True)
        self.assertIn("needs TensorFlow, which is not installed", message)
        self.assertIn("pip install 'tf-towers[cpu]'", message)
        self.assertIn("pip install 'tf-towers[gpu]'", message)


class CodeRulesTest(tf.test.TestCase):
    def test_a_test_process_starts_without_tensorflow_noise(self):
        """TensorFlow logs INFO lines while it starts, whatever TF_CPP_MIN_LOG_LEVEL says."""
        env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
        done = subprocess.run(
            [sys.executable, "-c", "from tests import test_util; print(test_util.KIND)"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        self.assertEqual((done.returncode, done.stdout), (0, "CPU\n"), done.stderr[-2000:])
        self.assertEqual(done.stderr, "")

    def test_library_never_imports_keras(self):
        """But the benchmark's real models (`towers/bench/_keras_*.py`), which the models
        suite of `python -m towers.bench` alone loads, to measure models built of Keras."""
        for package in PACKAGES:
            for path in _python_files(package):
                if path.parent.name == "bench" and path.name.startswith("_keras_"):
                    continue
                for module in _imported_modules(path):
                    self.assertNotRegex(module, r"^(keras|tf_keras)\b", path.name)
                self.assertNotIn("tf.keras", path.read_text(), path.name)

    def test_library_has_no_asserts(self):
        for package in PACKAGES:
            for path in _python_files(package):
                asserts = [
                    n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Assert)
                ]
                self.assertEqual(asserts, [], path.name)

    def test_modules_stay_small(self):
        for package in PACKAGES:
            for path in _python_files(package):
                self.assertLess(len(path.read_text().splitlines()), 300, path.name)

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
        self.assertTrue(re.search(r"pip install -q -e \"\.\[cpu,test\]\"", command), command)


if __name__ == "__main__":
    tf.test.main()
