import numpy as np
import tensorflow as tf
from absl.testing import parameterized

from tests import test_util
from towers import ops


class ShardSizesTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.parameters(
        (10, 4, [3, 3, 2, 2]),
        (8, 4, [2, 2, 2, 2]),
        (5, 5, [1] * 5),
        (7, 1, [7]),
        (11, 3, [4, 4, 3]),
    )
    def test_static_sizes_differ_by_at_most_one(self, batch, k, expected):
        self.assertEqual(ops.shard_sizes(batch, k), expected)

    def test_sizes_of_a_nested_batch(self):
        self.assertEqual(ops.shard_sizes(test_util.batch(11), 4), [3, 3, 3, 2])

    def test_dynamic_sizes_in_graph(self):
        @tf.function(input_signature=[tf.TensorSpec([None, 2])])
        def sizes(x):
            return ops.shard_sizes(x, 4)

        self.assertAllEqual(sizes(tf.zeros([11, 2])), [3, 3, 3, 2])
        self.assertAllEqual(sizes(tf.zeros([4, 2])), [1, 1, 1, 1])

    def test_bad_num_splits(self):
        with self.assertRaisesRegex(ValueError, "`num_splits` must be an int >= 1; got 0"):
            ops.shard_sizes(8, 0)
        with self.assertRaisesRegex(TypeError, "`num_splits` must be an int >= 1; got 2.0"):
            ops.shard_sizes(8, 2.0)

    def test_batch_smaller_than_splits(self):
        with self.assertRaisesRegex(
            ValueError, r"num_splits=4, batch size=3\. Use fewer towers or a larger batch"
        ):
            ops.shard_sizes(3, 4)


class SplitBatchTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.product(k=[1, 2, 3, 4, 8], batch=[8, 11, 24])
    def test_shards_concatenate_back_to_the_batch(self, k, batch):
        inputs = test_util.batch(batch)
        shards = ops.split_batch(inputs, k)
        sizes = ops.shard_sizes(batch, k)
        self.assertLen(shards, k)
        for shard, size in zip(shards, sizes):
            tf.nest.assert_same_structure(shard, inputs)
            self.assertEqual(shard[1].shape, [size])
            self.assertEqual(shard[0]["ids"].shape, [size, 2])
        for whole, *parts in zip(tf.nest.flatten(inputs), *map(tf.nest.flatten, shards)):
            self.assertAllEqual(tf.concat(parts, 0), whole)

    def test_lists_and_tuples_keep_their_type(self):
        x = tf.reshape(tf.range(12.0), [6, 2])
        shards = ops.split_batch([x, (x, {"a": x})], 3)
        self.assertIsInstance(shards[0], list)
        self.assertIsInstance(shards[0][1], tuple)
        self.assertAllEqual(shards[2][1][1]["a"], x[4:])

    def test_dynamic_batch_splits_exactly_and_keeps_static_dims(self):
        @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32)])
        def split(x):
            shards = ops.split_batch(x, 4)
            for shard in shards:
                self.assertEqual(shard.shape.as_list(), [None, 3])
            return shards

        x = tf.reshape(tf.range(33.0), [11, 3])
        shards = split(x)
        self.assertEqual([s.shape[0] for s in shards], [3, 3, 3, 2])
        self.assertAllEqual(tf.concat(shards, 0), x)

    def test_dynamic_batch_smaller_than_splits_fails_at_run_time(self):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
        def split(x):
            return ops.split_batch(x, 4)

        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "batch size must be >= "):
            split(tf.zeros([3]))

    def test_dynamic_batch_mismatch_fails_at_run_time(self):
        spec = tf.TensorSpec([None], tf.float32)

        @tf.function(input_signature=[spec, spec])
        def split(x, y):
            return ops.split_batch({"x": x, "y": y}, 2)

        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "same batch size"):
            split(tf.zeros([4]), tf.zeros([5]))

    def test_split_is_built_on_the_chosen_device(self):
        @tf.function
        def split(x):
            with tf.device("/device:CPU:5"):
                ops.split_batch(x, 2)
                ops.split_batch(x, 2, device="/cpu:3")
                ops.split_batch(x, 2, device=None)

        graph = split.get_concrete_function(tf.zeros([4, 2])).graph
        devices = test_util.op_devices(graph, "split")
        split_ops = [op for op in graph.get_operations() if op.type.startswith("Split")]
        self.assertLen(split_ops, 3)
        self.assertEqual(
            sorted(devices[op.name] for op in split_ops),
            ["/device:CPU:0", "/device:CPU:3", "/device:CPU:5"],
        )

    def test_works_in_a_v1_graph(self):
        with tf.Graph().as_default():
            x = tf.compat.v1.placeholder(tf.float32, [None, 2])
            shards = ops.split_batch(x, 3)
            with tf.compat.v1.Session() as sess:
                out = sess.run(shards, {x: np.arange(14.0).reshape(7, 2)})
        self.assertEqual([o.shape[0] for o in out], [3, 2, 2])

    def test_mismatched_batch_dimensions(self):
        with self.assertRaisesRegex(
            ValueError,
            r"same batch \(first\) dimension; got `inputs\['a'\]`: 4, `inputs\['b'\]`: 5",
        ):
            ops.split_batch({"a": tf.zeros([4]), "b": tf.zeros([5, 2])}, 2)

    def test_batch_smaller_than_splits(self):
        with self.assertRaisesRegex(ValueError, "num_splits=4, batch size=3"):
            ops.split_batch(tf.zeros([3, 2]), 4)

    @parameterized.parameters(
        (np.zeros([4, 2]), "ndarray"), ([1.0, 2.0], "float"), (None, "NoneType")
    )
    def test_non_tensor_leaves(self, leaf, type_name):
        with self.assertRaisesRegex(
            TypeError, rf"must be a dense tf.Tensor; got {type_name} at `inputs\['bad'\]"
        ):
            ops.split_batch({"good": tf.zeros([4]), "bad": leaf}, 2)

    def test_ragged_and_sparse_inputs_get_a_fix_that_works(self):
        ragged = tf.ragged.constant([[1, 2], [3], [4, 5, 6], [7]])
        with self.assertRaisesRegex(TypeError, r"got RaggedTensor at `inputs\[0\]`.*to_tensor"):
            ops.split_batch((ragged, tf.zeros([4])), 2)
        self.assertLen(ops.split_batch((ragged.to_tensor(), tf.zeros([4])), 2), 2)  # the fix
        sparse = tf.sparse.from_dense(tf.eye(4))
        with self.assertRaisesRegex(TypeError, r"got SparseTensor at `inputs`.*sparse.to_dense"):
            ops.split_batch(sparse, 2)
        self.assertLen(ops.split_batch(tf.sparse.to_dense(sparse), 2), 2)

    def test_scalar_leaf(self):
        with self.assertRaisesRegex(ValueError, r"`inputs\[1\]` is a scalar"):
            ops.split_batch((tf.zeros([4]), tf.constant(1.0)), 2)

    def test_empty_structure(self):
        with self.assertRaisesRegex(ValueError, "at least one tensor"):
            ops.split_batch({}, 2)


if __name__ == "__main__":
    tf.test.main()
