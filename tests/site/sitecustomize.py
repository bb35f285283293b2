"""Keras loads when a test's process uses it, not while TensorFlow loads.

`tests/test_util.py` puts this folder on `PYTHONPATH`, so Python runs this module as it starts
each process of the suite (its workers, and every process a test starts that keeps the
environment). TensorFlow 2.21's `__init__` imports `keras.src.optimizers` eagerly, only to
register Keras's optimizers for SavedModel (and passes on an ImportError): 1.5-2 s of CPU in
each of the ~80 processes the suite starts, most of which never touch Keras. Here that one
import fails; `tf.keras` and `import keras` load it later, in full, where a test uses them.
"""

import sys


def _inside_tensorflow_init(frame) -> bool:
    """Whether TensorFlow's `__init__` runs this import itself (not a spec query of it)."""
    while frame is not None:
        code = frame.f_code
        if code.co_filename.endswith(("importlib/util.py", "tools/module_util.py")):
            return False  # TensorFlow asking where Keras is: let it find it
        if code.co_name == "<module>" and frame.f_globals.get("__name__") == "tensorflow":
            return True
        frame = frame.f_back
    return False


class _KerasWhenUsed:
    """Refuses `keras` to TensorFlow's own start-up import, and to nobody else."""

    def find_spec(self, name, path=None, target=None):
        if name == "keras" and _inside_tensorflow_init(sys._getframe(1)):
            raise ModuleNotFoundError("keras loads when used (tests/site/sitecustomize.py)")
        return None


sys.meta_path.insert(0, _KerasWhenUsed())
