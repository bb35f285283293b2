"""Micro-batches within a step, and accumulation across calls: both the one big step."""

import os

import tensorflow as tf
from absl.testing import parameterized

import towers
from tests import test_util


def _build():
    model = test_util.Model()
    model(test_util.batch(1)[0])
    return model


def _concat(*batches):
    return tf.nest.map_structure(lambda *parts: tf.concat(parts, axis=0), *batches)


class MicroBatchTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.product(micro_batches=[2, 3], strategy=["ps", "replicated"])
    def test_equals_the_whole_batch_step(self, micro_batches, strategy):
        devices = test_util.devices(3)
        if strategy == "replicated":
            model = towers.Replicated(_build, devices)
            local = model.local
        else:
            model = _build()
            local = lambda: model  # noqa: E731
        optimizer = towers.SGD(0.1, momentum=0.9)

        @tf.function
        def step(batch):
            return towers.train_step(
                lambda b: test_util.loss_fn(local())(b),
                model,
                optimizer,
                batch,
                devices,
                micro_batches=micro_batches,
            )

        reference = _build()
        reference_step = test_util.reference_step(reference, test_util.loss_fn(reference), 0.1, 0.9)
        for i in range(4):
            batch = test_util.batch(11, seed=i)  # shards of 4, 4, 3: parts of 2, 2, 1...
            loss, logits = step(batch)
            want_loss, want_logits = reference_step(batch)
            test_util.assert_allclose(loss, want_loss, rtol=1e-6)
            test_util.assert_allclose(logits, want_logits, rtol=1e-5, atol=1e-6)
        trained = model.replicas[0] if strategy == "replicated" else model
        for got, want in zip(trained.variables, reference.variables):
            test_util.assert_allclose(got, want, rtol=1e-6, atol=1e-7)

    def test_parts_run_one_after_the_other(self):
        model = _build()
        seen = []

        def loss_fn(batch):
            seen.append(tf.nest.flatten(batch)[0])
            return test_util.loss_fn(model)(batch)[0]

        @tf.function
        def step(batch):
            return towers.train_step(
                loss_fn, model, towers.SGD(0.1), batch, test_util.devices(1), micro_batches=3
            )

        step.get_concrete_function(test_util.batch(9))
        for later in seen[1:]:  # each part's input waits for the previous part's gradients
            self.assertEqual(later.op.type, "Identity")
            self.assertNotEmpty(later.op.control_inputs)

    def test_bad_micro_batches(self):
        model = _build()
        for micro_batches, error, message in [
            (0, ValueError, "`micro_batches` must be an int >= 1; got 0"),
            (2.0, TypeError, "`micro_batches` must be an int >= 1; got 2.0"),
            (5, ValueError, "at least micro_batches=5 examples"),
        ]:
            with self.assertRaisesRegex(error, message):
                towers.train_step(
                    test_util.loss_fn(model),
                    model,
                    towers.SGD(0.1),
                    test_util.batch(8),
                    test_util.devices(2),
                    micro_batches=micro_batches,
                )


class AcrossCallsTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.parameters("ps", "replicated")
    def test_every_third_call_applies_the_mean_of_the_three_batches(self, strategy):
        devices = test_util.devices(2)
        if strategy == "replicated":
            model = towers.Replicated(_build, devices)
            local = model.local
        else:
            model = _build()
            local = lambda: model  # noqa: E731
        accumulator = towers.GradientAccumulator(every=3)
        optimizer = towers.Adam(0.01)

        @tf.function
        def step(batch):
            return towers.train_step(
                lambda b: test_util.loss_fn(local())(b),
                model,
                optimizer,
                batch,
                devices,
                accumulate=accumulator,
            )

        reference = _build()
        reference_optimizer = towers.Adam(0.01)
        trained = model.replicas[1] if strategy == "replicated" else model
        # Uneven calls; the second window's sizes are the first's (its data are not): a step
        # traces once per batch shape, and a second window of new shapes traced three more.
        sizes = [5, 7, 4, 5, 7, 4]
        for window in (0, 3):
            batches = [
                test_util.batch(n, seed=window + i)
                for i, n in enumerate(sizes[window : window + 3])
            ]
            before = [v.numpy() for v in trained.variables]
            for i, batch in enumerate(batches):
                step(batch)
                if i < 2:  # nothing applied yet
                    for got, want in zip(trained.variables, before):
                        self.assertAllEqual(got, want)
            with tf.GradientTape() as tape:  # the reference: one step on all three batches
                loss, _ = test_util.loss_fn(reference)(_concat(*batches))
            grads = tape.gradient(loss, reference.trainable_variables)
            reference_optimizer.apply_gradients(zip(grads, reference.trainable_variables))
            for got, want in zip(trained.variables, reference.variables):
                test_util.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        self.assertEqual(int(accumulator.calls), 6)
        self.assertEqual(float(accumulator.examples), 0.0)
        if strategy == "replicated":
            towers.check_replicas_identical(model)

    def test_its_own_add_ready_and_finish_give_the_mean_of_the_calls(self):
        """The public calls a loop of one's own makes (train_step holds, then settles, each
        call instead): `add` returns the mean gradient since the last update, `ready` says
        when `every` calls are in, `finish` counts the call and resets after an update."""
        model = _build()
        variables = model.trainable_variables
        accumulator = towers.GradientAccumulator(every=2)
        accumulator.build({v.name: (v,) for v in variables})
        sizes = [3, 5, 3, 5]
        batches = [test_util.batch(n, seed=i) for i, n in enumerate(sizes)]
        means = []
        for batch, size in zip(batches, sizes):
            with tf.GradientTape() as tape:
                loss, _ = test_util.loss_fn(model)(batch)
            grads = tape.gradient(loss, variables)
            ready = accumulator.ready()
            means.append((bool(ready), accumulator.add(grads, variables, size)))
            accumulator.finish(ready, size, after=[])
        self.assertEqual([ready for ready, _ in means], [False, True, False, True])
        for window in (0, 2):  # the model is not updated: each window's mean is of its batches
            with tf.GradientTape() as tape:
                loss, _ = test_util.loss_fn(model)(_concat(*batches[window : window + 2]))
            for got, want in zip(means[window + 1][1], tape.gradient(loss, variables)):
                if want is None:  # (a variable the loss does not reach: no sum, no mean)
                    self.assertIsNone(got)
                    continue
                want = tf.convert_to_tensor(want)  # (an embedding's rows, dense)
                test_util.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        self.assertEqual(int(accumulator.calls), 4)
        self.assertEqual(float(accumulator.examples), 0.0)
        for total in accumulator.sum_variables:
            self.assertAllEqual(total, tf.zeros_like(total))

    @parameterized.parameters("ps", "replicated")
    def test_the_call_that_applies_is_chosen_on_the_host(self, strategy):
        """The accumulator's cond reads the host's count of calls: it is built there, with
        towers off the host (unplaced, it went to the first GPU whatever the towers' devices,
        and a failing step's error came twice)."""
        devices = test_util.devices(3)[1:]
        model = towers.Replicated(_build, devices) if strategy == "replicated" else _build()
        local = model.local if strategy == "replicated" else (lambda: model)
        optimizer, accumulator = towers.SGD(0.1), towers.GradientAccumulator(every=2)

        @tf.function
        def step(batch):
            return towers.train_step(
                lambda b: test_util.loss_fn(local())(b), model, optimizer, batch, devices,
                accumulate=accumulator,
            )  # fmt: skip

        graph = step.get_concrete_function(test_util.batch(4)).graph
        conds = [op for op in graph.get_operations() if op.type in ("If", "StatelessIf")]
        self.assertNotEmpty(conds)
        for op in conds:
            self.assertEqual(test_util.local_device(op.device), "/device:CPU:0", op.name)

    def test_the_hook_sees_only_the_accumulated_mean(self):
        model, seen = _build(), []
        accumulator = towers.GradientAccumulator(every=3)
        batches = [test_util.batch(n, seed=i) for i, n in enumerate([5, 7, 4])]
        for batch in batches:  # eagerly: the hook runs exactly when the update does
            towers.train_step(
                test_util.loss_fn(model),
                model,
                towers.SGD(0.0),
                batch,
                test_util.devices(2),
                accumulate=accumulator,
                gradient_hook=lambda g, v: seen.append(g) or g,
            )
        self.assertLen(seen, 1)
        expected, _ = test_util.reference_gradients(_build(), _concat(*batches))
        for got, want in zip(seen[0], expected):
            if want is not None:
                test_util.assert_allclose(got, test_util.dense(want), rtol=1e-5, atol=1e-7)

    def test_partial_sums_resume_from_a_checkpoint(self):
        directory = os.path.join(self.get_temp_dir(), "run")
        devices = test_util.devices(2)
        batches = [test_util.batch(n, seed=i) for i, n in enumerate([5, 7, 4])]

        def run(model, accumulator, steps):
            step = tf.function(
                lambda b: towers.train_step(
                    test_util.loss_fn(model),
                    model,
                    towers.SGD(0.1),
                    b,
                    devices,
                    accumulate=accumulator,
                )
            )
            for batch in steps:
                step(batch)

        whole = _build()
        run(whole, towers.GradientAccumulator(3), batches)
        first, accumulator = _build(), towers.GradientAccumulator(3)
        with towers.CheckpointManager(directory, first, extra={"acc": accumulator}) as manager:
            run(first, accumulator, batches[:2])
            manager.save(2)
        second, accumulator = _build(), towers.GradientAccumulator(3)
        with towers.CheckpointManager(directory, second, extra={"acc": accumulator}) as manager:
            self.assertEqual(manager.restore_latest(), 2)
        self.assertEqual(int(accumulator.calls), 2)
        run(second, accumulator, batches[2:])
        for got, want in zip(second.variables, whole.variables):
            test_util.assert_allclose(got, want, rtol=1e-6, atol=1e-7)

    def test_bad_arguments(self):
        with self.assertRaisesRegex(ValueError, "`every` must be an int >= 1; got 0"):
            towers.GradientAccumulator(0)
        model = _build()
        with self.assertRaisesRegex(TypeError, "`accumulate` must be a towers.GradientAcc"):
            towers.train_step(
                test_util.loss_fn(model),
                model,
                towers.SGD(0.1),
                test_util.batch(4),
                test_util.devices(2),
                accumulate=3,
            )


if __name__ == "__main__":
    tf.test.main()
