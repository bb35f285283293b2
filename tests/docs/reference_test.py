"""The API reference (`docs/make_reference.py`): current, complete, and every argument described."""

import contextlib
import importlib.util
import inspect
import io
import pathlib
import tempfile

import tensorflow as tf

import towers
from towers import ops

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
_SPEC = importlib.util.spec_from_file_location(
    "make_reference", ROOT / "docs" / "make_reference.py"
)
make_reference = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(make_reference)


def undescribed_parameters(name: str, signature: inspect.Signature, doc: str) -> list[str]:
    """A line for each parameter of `signature` that the Args of `doc` do not name."""
    described = set(make_reference.item_names(doc, "Args"))
    described |= set(make_reference.item_names(doc, "Attributes"))  # a dataclass's fields
    return [
        f"{name}: Args does not describe `{p.name}`"
        for p in signature.parameters.values()
        if not {p.name, f"*{p.name}", f"**{p.name}"} & described
    ]


def argument_problems(entry) -> list[str]:
    """What the reference's entry for a function, or a class and its methods, leaves out."""
    obj = entry.obj
    if inspect.isroutine(obj):
        return undescribed_parameters(entry.name, make_reference.own_signature(obj), obj.__doc__)
    if not isinstance(obj, type):
        return []
    problems = undescribed_parameters(
        entry.name, make_reference.own_signature(obj), make_reference.class_doc(obj)
    )
    for attr, _ in make_reference.members(obj):
        method = getattr(obj, attr)
        if inspect.isroutine(method):
            problems += undescribed_parameters(
                f"{entry.name}.{attr}",
                make_reference.own_signature(method),
                make_reference.member_doc(obj, attr),
            )
    return problems


class ReferenceTest(tf.test.TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.rendered = make_reference.render_all()

    def test_committed_reference_is_current(self):
        stale = make_reference.stale_files(self.rendered)
        self.assertEqual(
            stale, [], "The reference is stale: run `python docs/make_reference.py` and commit."
        )

    def test_every_public_name_is_in_the_index_and_on_a_page(self):
        index = self.rendered[make_reference.INDEX]
        pages = {n: t for n, t in self.rendered.items() if n != make_reference.INDEX}
        names = [f"towers.{n}" for n in towers.__all__] + [f"towers.ops.{n}" for n in ops.__all__]
        missing = []
        for name in names:
            on_pages = [p for p, text in pages.items() if f"\n## {name}\n" in text]
            if len(on_pages) != 1:
                missing.append(f"{name} has an entry on {len(on_pages)} pages, not 1")
            elif f"[`{name}`]({on_pages[0]}#{make_reference.anchor(name)})" not in index:
                missing.append(f"{name} has no line in the index linking to its entry")
        self.assertEqual(missing, [])

    def test_every_argument_is_described(self):
        problems = []
        for entry in make_reference.entries():
            problems += argument_problems(entry)
        self.assertEqual(problems, [], "Describe each in the docstring's Args section.")

    def test_output_is_stable(self):
        text = "".join(self.rendered.values())
        self.assertNotRegex(text, r"0x[0-9a-fA-F]{6,}")  # no object addresses
        self.assertEqual(make_reference.render_all(), self.rendered)

    def test_stale_files_names_changed_missing_and_left_over_files(self):
        with tempfile.TemporaryDirectory(dir=ROOT) as directory:
            directory = pathlib.Path(directory)
            make_reference.write({"README.md": "index\n", "a.md": "a\n"}, directory)
            (directory / "old.md").write_text("old\n")
            stale = make_reference.stale_files(
                {"README.md": "index\n", "a.md": "changed\n", "b.md": "b\n"}, directory
            )
            self.assertEqual([pathlib.Path(p).name for p in stale], ["a.md", "b.md", "old.md"])

    def test_check_exits_1_naming_the_stale_files(self):
        with tempfile.TemporaryDirectory(dir=ROOT) as directory:
            directory = pathlib.Path(directory)
            make_reference.write(self.rendered, directory)
            with contextlib.redirect_stdout(io.StringIO()) as out:
                self.assertEqual(make_reference.check(self.rendered, directory), 0)
            self.assertEqual(out.getvalue(), "")
            (directory / "core.md").write_text("edited by hand\n")
            with contextlib.redirect_stdout(io.StringIO()) as out:
                self.assertEqual(make_reference.check(self.rendered, directory), 1)
            self.assertIn(f"stale: {directory.name}/core.md", out.getvalue())
            self.assertIn("python docs/make_reference.py", out.getvalue())


if __name__ == "__main__":
    tf.test.main()
