"""The test process set up by `tests.test_util` (8 logical CPUs, quiet logs) before any test.

Under pytest-xdist (`-n`, on by default in pyproject.toml) the controller runs no test, so it
imports no TensorFlow: TensorFlow 2.21 logs a few lines before its log level applies, which
the controller, unlike a worker, would show.
"""

import gc

import pytest


def pytest_configure(config):
    """Sets the process up, except in an xdist controller, which keeps the classes in the
    order `pytest_collection_modifyitems` gives."""
    controller = getattr(config, "workerinput", None) is None and config.getoption(
        "numprocesses", default=None
    )
    if not controller:
        from tests import test_util  # noqa: F401  (imported for its set-up)
    # pytest-xdist 3.6 and later order `--dist loadscope`'s classes by their number of tests
    # unless told not to (`--no-loadscope-reorder`, an option earlier versions do not know).
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


# Folders of long tests (processes, whole trainings), run first: two processes then finish
# together, instead of one waiting out the other's last long test. The order never changes
# a result: every test sets up what it needs.
_LONG_FIRST = (
    "tests/towers/workers/",
    "tests/examples/",
    "tests/towers/bench/",
    "tests/towers/weights/",
    "tests/public_api_test.py",
)


def pytest_collection_modifyitems(items):
    """Drops `tf.test.TestCase.test_session` (a context manager pytest mistakes for a test),
    and runs the long tests first (the same order in every xdist worker)."""
    items[:] = [item for item in items if item.name != "test_session"]

    def rank(item):
        path = item.nodeid.split("::")[0]
        return next((i for i, p in enumerate(_LONG_FIRST) if path.startswith(p)), len(_LONG_FIRST))

    items.sort(key=rank)  # stable: within a rank, the collection order


def pytest_collection_finish(session):
    """Freezes what the process holds once every test module is imported (TensorFlow, towers,
    the tests' modules: about 320,000 objects that live as long as the process), so that no
    garbage collection walks them again: a full collection took 0.13 s of CPU here, frozen a
    few microseconds, whether `pytest_runtest_teardown` asks for it or Python starts one.
    Only objects made before the first test are frozen; a test's garbage is collected as
    before."""
    gc.collect()
    gc.freeze()


# Tests whose tf.data iterators end up in reference cycles (a `tf.function` that captured one,
# a snippet's namespace, a test class's state). TensorFlow 2.21 destroys an iterator by waiting
# for its autotuning thread, which sleeps out its optimization period (doubling up to a
# minute while the iterator lives; gdb: the main thread in `RootDataset::Iterator::~Iterator`,
# the model thread in `Model::OptimizeLoop`'s timed wait). Several such iterators waiting in
# one later collection stalled a test for 14-187 s with no CPU used. Collected right after the
# test that made them, while their period is short, they go at once.
_MAKE_PIPELINES = (
    "tests/docs/",
    "tests/examples/",
    "tests/towers/bench/",
    "tests/towers/data/",
    "tests/towers/checkpoints/iterator_state_test.py",
    "tests/towers/progress/",
)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """Collects a pipeline-making test's garbage once its teardown is done (see
    `_MAKE_PIPELINES`): after the test case object and, at a class's last test, the class's
    state are let go. (Collected in an autouse fixture's teardown, which runs before both,
    a later collection still stalled 50-59 s, at the same test in two suite runs.)"""
    yield
    if item.nodeid.startswith(_MAKE_PIPELINES):
        gc.collect()
