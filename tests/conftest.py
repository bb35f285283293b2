"""The test process set up by `tests.test_util` (8 logical CPUs, quiet logs) before any test.

Under pytest-xdist (`-n`, on by default in pyproject.toml) the controller runs no test, so it
imports no TensorFlow: TensorFlow 2.21 logs a few lines before its log level applies, which
the controller, unlike a worker, would show.
"""


def pytest_configure(config):
    """Sets the process up, except in an xdist controller."""
    controller = getattr(config, "workerinput", None) is None and config.getoption(
        "numprocesses", default=None
    )
    if not controller:
        from tests import test_util  # noqa: F401  (imported for its set-up)


def pytest_collection_modifyitems(items):
    """Drops `tf.test.TestCase.test_session`, a context manager pytest mistakes for a test."""
    items[:] = [item for item in items if item.name != "test_session"]
