import math

import keras
import tensorflow as tf
from absl.testing import parameterized

import towers
from tests import test_util  # noqa: F401  (the test process's devices)
from towers import schedules

STEPS = [0, 1, 5, 10, 99, 100, 101, 250]


class ScheduleTest(tf.test.TestCase, parameterized.TestCase):
    def _values(self, schedule):
        return [float(schedule(tf.constant(s, tf.int64))) for s in STEPS]

    def test_constant_and_piecewise(self):
        self.assertAllClose(self._values(schedules.Constant(0.3)), [0.3] * len(STEPS))
        piecewise = schedules.PiecewiseConstant([10, 100], [1.0, 0.5, 0.1])
        expected = [1.0 if s <= 10 else 0.5 if s <= 100 else 0.1 for s in STEPS]
        self.assertAllClose(self._values(piecewise), expected)
        keras_piecewise = keras.optimizers.schedules.PiecewiseConstantDecay(
            [10, 100], [1.0, 0.5, 0.1]
        )
        self.assertAllClose(expected, [float(keras_piecewise(s)) for s in STEPS])

    @parameterized.parameters(False, True)
    def test_exponential_decay(self, staircase):
        schedule = schedules.ExponentialDecay(0.1, 100, 0.5, staircase=staircase)
        exponent = [(s // 100 if staircase else s / 100) for s in STEPS]
        self.assertAllClose(self._values(schedule), [0.1 * 0.5**e for e in exponent])

    def test_cosine_decay_and_warmup(self):
        cosine = schedules.CosineDecay(0.2, 100, alpha=0.1)
        expected = [
            0.2 * (0.9 * 0.5 * (1 + math.cos(math.pi * min(s, 100) / 100)) + 0.1) for s in STEPS
        ]
        self.assertAllClose(self._values(cosine), expected)
        warm = schedules.LinearWarmup(10, cosine, initial=0.0)
        expected = [0.2 * s / 10 if s < 10 else float(cosine(s - 10)) for s in STEPS]
        self.assertAllClose(self._values(warm), expected)
        # By default the first update moves (before: a rate of 0, an update doing nothing).
        self.assertAllClose(self._values(schedules.LinearWarmup(4, 0.5))[:3], [0.125, 0.25, 0.5])
        self.assertAllClose(
            self._values(schedules.LinearWarmup(4, 0.5, initial=0.0))[:2], [0, 0.125]
        )

    def test_piecewise_boundaries_are_compared_exactly(self):
        """Before: in float32, 16777217 > 16777216 was False."""
        late = schedules.PiecewiseConstant([16777216], [1.0, 0.5])
        self.assertEqual(float(late(tf.constant(16777216, tf.int64))), 1.0)
        self.assertEqual(float(late(tf.constant(16777217, tf.int64))), 0.5)
        self.assertEqual(float(late(16777217)), 0.5)

    def test_bad_arguments(self):
        for make, error, message in [
            (lambda: schedules.Constant(-1.0), ValueError, "`value` must be a finite number >= 0"),
            (lambda: schedules.Constant(float("nan")), ValueError, "`value` must be a finite"),
            (lambda: schedules.PiecewiseConstant([1], [1.0]), ValueError, "one more entry"),
            (lambda: schedules.PiecewiseConstant([5, 2], [1, 2, 3]), ValueError, "must increase"),
            (
                lambda: schedules.ExponentialDecay(0.1, 0, 0.5),
                ValueError,
                "`decay_steps` must be a finite number > 0",
            ),
            (
                lambda: schedules.CosineDecay(0.1, 10, alpha=2),
                ValueError,
                r"`alpha` must be a finite number in \[0, 1\]",
            ),
            (lambda: schedules.LinearWarmup(10, "fast"), TypeError, "`after` must be a"),
            (
                lambda: schedules.PiecewiseConstant(["a", "b"], [1.0, 0.5, 0.1]),
                TypeError,
                "`each boundary` must be an int >= 0; got 'a'",
            ),
            (
                lambda: schedules.PiecewiseConstant([1.5], [1.0, 0.5]),
                TypeError,
                "`each boundary` must be an int",
            ),
        ]:
            with self.assertRaisesRegex(error, message):
                make()


class OptimizerScheduleTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.parameters("towers", "keras")
    def test_update_t_uses_the_rate_after_t_updates(self, kind):
        rates = [0.1, 0.01, 0.001]
        if kind == "towers":
            schedule = schedules.PiecewiseConstant([0, 1], rates)
        else:
            schedule = keras.optimizers.schedules.PiecewiseConstantDecay([0, 1], rates)
        var = tf.Variable(0.0)
        optimizer = towers.SGD(schedule)

        @tf.function
        def step():
            optimizer.apply_gradients([(tf.constant(1.0), var)])

        for _ in range(4):
            step()
        self.assertAllClose(var, -(0.1 + 0.01 + 0.001 + 0.001))
        self.assertEqual(int(optimizer.iterations[0]), 4)
        self.assertIn("optimizer/iterations", optimizer.variable_copies())


if __name__ == "__main__":
    tf.test.main()
