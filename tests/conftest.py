"""The test process set up by `tests.test_util` (8 logical CPUs, quiet logs) before any test."""

from tests import test_util  # noqa: F401  (imported for its set-up)


def pytest_collection_modifyitems(items):
    """Drops `tf.test.TestCase.test_session`, a context manager pytest mistakes for a test."""
    items[:] = [item for item in items if item.name != "test_session"]
