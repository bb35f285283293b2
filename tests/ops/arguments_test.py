"""The one argument check: a TypeError for a wrong type, a ValueError out of range."""

import numpy as np
import tensorflow as tf
from absl.testing import parameterized

from towers.ops import internal


class CheckIntTest(tf.test.TestCase, parameterized.TestCase):
    def test_ints_and_numpy_ints_pass_as_ints(self):
        self.assertEqual(internal.check_int(3, "n", minimum=1), 3)
        got = internal.check_int(np.int64(7), "n", maximum=7)
        self.assertEqual((got, type(got)), (7, int))
        self.assertIsNone(internal.check_int(None, "n", none=True))

    @parameterized.parameters(1.5, "3", True, None, np.float32(2.0))
    def test_other_types_are_a_type_error(self, value):
        with self.assertRaisesRegex(TypeError, "`n` must be an int >= 1; got "):
            internal.check_int(value, "n", minimum=1)

    def test_out_of_range_is_a_value_error_naming_the_range(self):
        with self.assertRaisesRegex(ValueError, r"`n` must be an int in \[1, 4\]; got 5\."):
            internal.check_int(5, "n", minimum=1, maximum=4)
        with self.assertRaisesRegex(ValueError, r"`n` must be an int <= 4 or None; got 9\."):
            internal.check_int(9, "n", maximum=4, none=True)


class CheckNumberTest(tf.test.TestCase, parameterized.TestCase):
    def test_numbers_pass_as_floats(self):
        self.assertEqual(internal.check_number(1, "x", minimum=0.0), 1.0)
        self.assertEqual(internal.check_number(np.float32(0.5), "x", below=1.0), 0.5)

    @parameterized.parameters(float("nan"), float("inf"), -float("inf"))
    def test_nan_and_infinities_are_refused(self, value):
        with self.assertRaisesRegex(ValueError, "`x` must be a finite number; got"):
            internal.check_number(value, "x")

    @parameterized.parameters(
        (dict(minimum=0.0), -1.0, ">= 0"),
        (dict(above=0.0), 0.0, "> 0"),
        (dict(maximum=1.0), 2.0, "<= 1"),
        (dict(below=1.0), 1.0, "< 1"),
        (dict(minimum=0.0, below=1.0), 1.0, r"in \[0, 1\)"),
        (dict(above=0.0, maximum=1e-7), 1.0, r"in \(0, 1e-07\]"),
    )
    def test_each_bound_is_held_and_named(self, bounds, value, words):
        with self.assertRaisesRegex(ValueError, f"`x` must be a finite number {words}; got"):
            internal.check_number(value, "x", **bounds)

    @parameterized.parameters(True, "0.1", None, ([1.0],))
    def test_other_types_are_a_type_error(self, value):
        with self.assertRaisesRegex(TypeError, "`x` must be a finite number; got"):
            internal.check_number(value, "x")


class CheckBoolTest(tf.test.TestCase):
    def test_only_bools(self):
        self.assertTrue(internal.check_bool(True, "flag"))
        for value in (1, "yes", None):
            with self.assertRaisesRegex(TypeError, "`flag` must be True or False; got"):
                internal.check_bool(value, "flag")


if __name__ == "__main__":
    tf.test.main()
