"""Owned variables: gradients reduced to their owner, values gathered from it."""

import numpy as np
import tensorflow as tf
from absl.testing import parameterized

from tests import test_util
from tests.ops.all_reduce_gradients_test import _tower_grads
from towers import ops
from towers.ops import internal


class OwnedTest(tf.test.TestCase, parameterized.TestCase):
    def test_owners_balance_bytes_whole_variables_largest_first(self):
        shapes = [[10], [100], [30], [30], [40]]
        owners = internal.owners_by_bytes([tf.zeros(s) for s in shapes], 3)
        self.assertEqual(owners, [1, 0, 2, 2, 1])  # 100 -> 0, 40 -> 1, 30 -> 2, 30 -> 2, 10 -> 1
        self.assertEqual(internal.owners_by_bytes([tf.zeros([2])], 3), [0])

    @parameterized.product(algorithm=["reduce_broadcast", "ring", "collective"], bucket=[None, 64])
    def test_each_owner_gets_the_mean_gradient_of_its_variables(self, algorithm, bucket):
        model = test_util.built_model()
        variables = list(model.trainable_variables)
        devices = test_util.devices(3)
        owners = internal.owners_by_bytes(variables, 3)

        @tf.function
        def reduce(batch):
            grads = _tower_grads(model, batch, 3, devices)
            sizes = ops.shard_sizes(batch, 3)
            mine = internal.reduce_to_owners(
                grads, devices, owners, weights=sizes, algorithm=algorithm,
                bucket_bytes=bucket, variables=variables,
            )  # fmt: skip
            values = [
                [tf.identity(v) if owners[j] == i else None for j, v in enumerate(variables)]
                for i in range(3)
            ]
            gathered = internal.gather_from_owners(
                values, devices, owners, algorithm=algorithm, bucket_bytes=bucket, like=variables
            )
            return mine, gathered

        expected, _ = test_util.reference_gradients(model, test_util.batch(11))
        mine, gathered = reduce(test_util.batch(11))
        for j, owner in enumerate(owners):
            for i in range(3):
                if i != owner or expected[j] is None:
                    self.assertIsNone(mine[i][j])
                    continue
                got, want = test_util.dense(mine[i][j]), test_util.dense(expected[j])
                test_util.assert_allclose(got, want)
        self.assertIsInstance(mine[owners[1]][1], tf.IndexedSlices)  # the embedding's rows
        for copy in gathered:
            for got, var in zip(copy, variables):
                np.testing.assert_array_equal(got, var)

    def test_bad_owners(self):
        devices = test_util.devices(2)
        grads = [[tf.ones([2])], [tf.ones([2])]]
        with self.assertRaisesRegex(
            ValueError, r"`owners` must give each of the 1 variables a rank"
        ):
            internal.reduce_to_owners(grads, devices, [2])
        with self.assertRaisesRegex(ValueError, "owns a variable but gives no value"):
            internal.gather_from_owners([[None], [None]], devices, [1], like=[tf.ones([2])])


if __name__ == "__main__":
    tf.test.main()
