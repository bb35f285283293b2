"""Exact resume: the input position is checkpoint state, so a resumed run reads the same data."""

import os

import numpy as np
import tensorflow as tf

import towers
from tests import test_util


def _dataset(batch_size=10):
    """A shuffled, repeated pipeline: where it stands is more than a step count can say."""
    inputs, labels = test_util.batch(64)
    return (
        tf.data.Dataset.from_tensor_slices((inputs, labels))
        .shuffle(32, seed=7)
        .repeat()
        .batch(batch_size)
    )


def _train(model, iterator, steps, devices):
    optimizer = towers.SGD(0.1)

    @tf.function
    def step(batch):
        return towers.train_step(test_util.loss_fn(model), model, optimizer, batch, devices)[0]

    for _ in range(steps):
        step(next(iterator))


def _built():
    model = test_util.Model()
    model(test_util.batch(1)[0])
    return model


class ExactResumeTest(tf.test.TestCase):
    def test_resumed_run_equals_an_uninterrupted_one(self):
        directory = os.path.join(self.get_temp_dir(), "run")
        whole = _built()
        _train(whole, iter(_dataset()), 6, test_util.devices(2))

        first, iterator = _built(), iter(_dataset())
        with towers.CheckpointManager(directory, first, extra={"input": iterator}) as manager:
            _train(first, iterator, 3, test_util.devices(2))
            manager.save(3)
        resumed, iterator = _built(), iter(_dataset())
        with towers.CheckpointManager(directory, resumed, extra={"input": iterator}) as manager:
            self.assertEqual(manager.restore_latest(), 3)
        _train(resumed, iterator, 3, test_util.devices(3))
        for got, want in zip(resumed.variables, whole.variables):
            test_util.assert_allclose(got, want, rtol=1e-6, atol=1e-7)

        # Without the input position, a resumed run reads the first batches again.
        again = _built()
        with towers.CheckpointManager(directory, again) as manager:
            manager.restore_latest()
        _train(again, iter(_dataset()), 3, test_util.devices(2))
        self.assertFalse(np.allclose(again.w1.numpy(), whole.w1.numpy(), atol=1e-5))

    def test_another_pipeline_is_refused_and_nothing_changes(self):
        directory = os.path.join(self.get_temp_dir(), "run")
        model, iterator = _built(), iter(_dataset())
        next(iterator)
        with towers.CheckpointManager(directory, model, extra={"input": iterator}) as manager:
            manager.save(1)
        other = test_util.Model(seed=3)
        other(test_util.batch(1)[0])
        before = [v.numpy() for v in other.variables]
        different = iter(tf.data.Dataset.range(5).map(lambda i: tf.strings.as_string(i)))
        with towers.CheckpointManager(directory, other, extra={"input": different}) as manager:
            with self.assertRaisesRegex(ValueError, "belongs to a pipeline of other elements"):
                manager.restore_latest()
        for got, want in zip(other.variables, before):
            self.assertAllEqual(got, want)

    def test_all_or_nothing_across_iterators_and_other_elements_refused(self):
        directory = os.path.join(self.get_temp_dir(), "run")
        model = _built()
        first, second = iter(tf.data.Dataset.range(10)), iter(tf.data.Dataset.range(10))
        with towers.CheckpointManager(directory, model, extra={"a": first, "b": second}) as manager:
            next(first), next(second)
            manager.save(1)
        fresh = iter(tf.data.Dataset.range(10))
        shuffled = iter(tf.data.Dataset.range(10).shuffle(4, seed=1))  # does not fit "b"
        with towers.CheckpointManager(
            directory, model, extra={"a": fresh, "b": shuffled}
        ) as manager:
            with self.assertRaisesRegex(ValueError, "does not fit this input pipeline"):
                manager.restore_latest()
        self.assertEqual(int(next(fresh)), 0)  # "a" was put back where it was
        other = iter(tf.data.Dataset.range(10).map(lambda i: tf.cast(i, tf.float32)))
        with towers.CheckpointManager(directory, model, extra={"a": other, "b": second}) as m:
            with self.assertRaisesRegex(ValueError, "belongs to a pipeline of other elements"):
                m.restore_latest()

    def test_a_checkpoint_without_the_position_needs_strict_false(self):
        directory = os.path.join(self.get_temp_dir(), "run")
        model = _built()
        with towers.CheckpointManager(directory, model) as manager:
            manager.save(1)
        iterator = iter(_dataset())
        with towers.CheckpointManager(directory, model, extra={"input": iterator}) as manager:
            with self.assertRaisesRegex(ValueError, "holds no input position"):
                manager.restore_latest()
            self.assertEqual(manager.restore_latest(strict=False), 1)


if __name__ == "__main__":
    tf.test.main()
