"""Towers' own state made inside a step: one trace, and state met in a later trace.

Before: an optimizer's slots and counts and an accumulator's sums made by a step's first
call were variables the `tf.function` knew of, so it traced the step twice (and compiled
each program twice), and state for variables first met in a later trace failed.
"""

import tensorflow as tf

import towers
from tests import test_util


class StateVariableTest(tf.test.TestCase):
    def test_a_step_that_makes_its_state_is_traced_once_and_equals_the_reference(self):
        """Replicated, compiled, momentum and an accumulator of two calls: their state is
        made by the first call, which traces once; the weights after four calls (two
        updates) are the hand-written step's on the accumulated batches."""
        devices = test_util.devices(2)
        model = towers.Replicated(test_util.built_model, devices)
        optimizer = towers.SGD(0.1, momentum=0.9)
        accumulator = towers.GradientAccumulator(every=2)
        traces = []

        @tf.function
        def step(batch):
            traces.append(1)
            return towers.train_step(
                lambda b: test_util.loss_fn(model.local())(b), model, optimizer, batch, devices,
                accumulate=accumulator, jit_compile=True,
            )  # fmt: skip

        reference = test_util.built_model()
        by_hand = test_util.reference_step(
            reference, test_util.loss_fn(reference), 0.1, momentum=0.9
        )
        for i in range(4):
            step(test_util.batch(8, seed=i))
        self.assertLen(traces, 1)
        self.assertNotEmpty(optimizer.slot_variables)
        self.assertNotEmpty(accumulator.sum_variables)
        for first in (0, 2):  # each update: the mean gradient of two calls' 8 examples
            batches = [test_util.batch(8, seed=first + j) for j in range(2)]
            by_hand(tf.nest.map_structure(lambda *t: tf.concat(t, 0), *batches))
        for got, want in zip(model.replicas[1].trainable_variables, reference.trainable_variables):
            test_util.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

    def test_state_for_variables_first_met_in_a_later_trace_is_made_there(self):
        """One function traced for one model, then for another: the second trace makes
        the other's momentum slots and applies its first update (w - 0.1 g). Before:
        ValueError ("tried to create variables on non-first call")."""
        models = [test_util.built_model(), test_util.built_model()]
        grads, _ = test_util.reference_gradients(models[1], test_util.batch(4))
        want = [
            v.numpy() - 0.1 * test_util.dense(g) if g is not None else v.numpy()
            for g, v in zip(grads, models[1].trainable_variables)
        ]
        optimizer = towers.SGD(0.1, momentum=0.9)

        @tf.function
        def apply(which, batch):
            model = models[which]
            with tf.GradientTape() as tape:
                loss, _ = test_util.loss_fn(model)(batch)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(
                [(g, v) for g, v in zip(grads, model.trainable_variables) if g is not None]
            )

        apply(0, test_util.batch(4))
        slots = len(optimizer.slot_variables)
        apply(1, test_util.batch(4))
        self.assertEqual(len(optimizer.slot_variables), 2 * slots)
        for got, expected in zip(models[1].trainable_variables, want):
            test_util.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)

    def test_state_of_an_owner_made_inside_the_function_is_not_lost_on_a_retrace(self):
        """An optimizer, an accumulator or a loss scale made inside the step: a new one each
        trace, whose state would restart silently (with hidden state, a retrace for a new
        shape reset it). Their state stays known to the function, so TensorFlow refuses it
        after the first trace, as before: the first call traces twice and fails."""
        model = towers.Replicated(test_util.built_model, test_util.devices(2))
        for make in (
            lambda: dict(optimizer=towers.SGD(0.1, momentum=0.9)),
            lambda: dict(optimizer=towers.SGD(0.1), accumulate=towers.GradientAccumulator(2)),
            lambda: dict(optimizer=towers.SGD(0.1), loss_scale=towers.DynamicLossScale()),
        ):

            @tf.function
            def step(batch, make=make):
                options = make()
                optimizer = options.pop("optimizer")
                return towers.train_step(
                    lambda b: test_util.loss_fn(model.local())(b), model, optimizer, batch,
                    model.devices, **options,
                )  # fmt: skip

            with self.assertRaisesRegex(ValueError, "singleton tf.Variables"):
                step(test_util.batch(8))
                step(test_util.batch(6))  # (a new shape: another trace)


if __name__ == "__main__":
    tf.test.main()
