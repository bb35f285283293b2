import re

import tensorflow as tf
from absl.testing import parameterized

import towers
from tests import test_util
from towers import ops

# Reads of a variable run where the variable lives, on the parameter server; the v1 test
# below checks where they actually ran.
_VARIABLE_READS = ("ReadVariableOp", "ResourceGather", "Placeholder")


def _tower_ops(graph: tf.Graph, index: int) -> dict[str, str]:
    """Requested device of every op built in tower `index` (forward and gradient)."""
    pattern = re.compile(rf"(^|/)tower_{index}/")
    return {
        op.name: (op.type, test_util.local_device(op.device))
        for op in graph.get_operations()
        if pattern.search(op.name)
    }


class ReplicateTest(tf.test.TestCase, parameterized.TestCase):
    def test_results_in_tower_order(self):
        shards = ops.split_batch(tf.range(8.0), 4)
        results = towers.replicate(tf.reduce_sum, shards, test_util.devices(4))
        self.assertAllEqual(results, [1.0, 5.0, 9.0, 13.0])

    @parameterized.parameters(4, 12)
    def test_each_tower_is_built_on_its_device_with_distinct_names(self, k):
        """12 towers over 8 devices: tower_1/ and tower_10/, tower_11/ never mix."""
        devices = [test_util.devices(8)[i % 8] for i in range(k)]
        model = test_util.Model()

        @tf.function
        def step(batch):
            shards = ops.split_batch(batch, k)
            fn = lambda shard: towers.tower_gradients(test_util.loss_fn(model), model, shard)  # noqa: E731
            return towers.replicate(fn, shards, devices)

        graph = step.get_concrete_function(test_util.batch(2 * k)).graph
        seen = set()
        for i in range(k):
            tower_ops = _tower_ops(graph, i)
            self.assertGreater(len(tower_ops), 20)
            self.assertFalse(seen & tower_ops.keys(), f"tower {i} shares ops with another")
            seen |= tower_ops.keys()
            computed = {n: d for n, (t, d) in tower_ops.items() if t not in _VARIABLE_READS}
            self.assertEqual(set(computed.values()), {devices[i]}, f"tower {i}")
        split = [op for op in graph.get_operations() if op.type.startswith("Split")]
        self.assertTrue(split)
        self.assertEqual({test_util.local_device(op.device) for op in split}, {"/device:CPU:0"})

    @parameterized.parameters("eager", "function", "v1")
    def test_variable_names_carry_no_tower_scope(self, mode):
        def fn(_):
            with tf.name_scope("dense"):
                return [tf.Variable(1.0, name="w"), tf.Variable(2.0, name="b")]

        def build():
            with tf.name_scope("train"):
                (created,) = towers.replicate(fn, [None], ["/cpu:1"])
            plain = tf.Variable(3.0, name="plain")
            towers.replicate(lambda _: tf.Variable(1.0, name="top"), [None], ["/cpu:1"])
            return [v.name for v in created] + [plain.name]

        if mode == "v1":
            with tf.Graph().as_default():
                names = build()
        elif mode == "function":
            names = []
            tf.function(lambda: names or names.extend(build())).get_concrete_function()
        else:
            names = build()
        self.assertEqual(names, ["train/dense/w:0", "train/dense/b:0", "plain:0"])

    def test_later_tower_creating_a_variable_is_named(self):
        def fn(shard):
            return shard * tf.Variable(1.0, name="fresh_layer")

        with self.assertRaisesRegex(
            ValueError, "Tower 1 created variable 'fresh_layer'; only the first tower"
        ):
            towers.replicate(fn, [1.0, 2.0], test_util.devices(2))

    def test_bad_arguments(self):
        with self.assertRaisesRegex(ValueError, "got 2 shards and 3 devices"):
            towers.replicate(tf.identity, [1, 2], test_util.devices(3))
        with self.assertRaisesRegex(ValueError, "`devices` must name at least one device"):
            towers.replicate(tf.identity, [], [])
        model = test_util.built_model()
        for devices, message in (
            ([], "`devices` must name at least one device"),  # before: "`num_splits` ... 0"
            (
                ["/job:worker/replica:0/task:3/device:CPU:0"],  # before: an error only when run
                r"is not this process's \(alone\)",
            ),
        ):
            with self.assertRaisesRegex(ValueError, message):
                tf.function(
                    lambda devices=devices: towers.train_step(
                        test_util.loss_fn(model),
                        model,
                        towers.SGD(0.1),
                        test_util.batch(4),
                        devices,
                    )
                ).get_concrete_function()
        with self.assertRaisesRegex(
            ValueError, r"Device '/device:CPU:9' in `devices` does not exist"
        ):
            towers.replicate(tf.identity, [1], ["/cpu:9"])
        with self.assertRaisesRegex(TypeError, "`fn` must be callable; got 3"):
            towers.replicate(3, [1], ["/cpu:0"])

    def test_one_device_name_is_not_split_into_characters(self):
        with self.assertRaisesRegex(
            TypeError, r"got the single device '/cpu:0'. Pass \['/cpu:0'\]"
        ):
            towers.replicate(tf.identity, [1.0], "/cpu:0")
        model = test_util.Model()
        with self.assertRaisesRegex(TypeError, "`devices` must be a list of devices"):
            towers.train_step(
                test_util.loss_fn(model), model, towers.SGD(0.1), test_util.batch(6), "/cpu:0"
            )

    def test_v1_graph_and_session_place_each_tower_on_its_device(self):
        """Checks where ops actually ran (step stats), not only where they were asked to."""
        devices = test_util.devices(3)
        with tf.Graph().as_default():
            model = test_util.Model()
            shards = ops.split_batch(test_util.batch(9), 3)

            def fn(shard):
                return towers.tower_gradients(test_util.loss_fn(model), model, shard)

            results = towers.replicate(fn, shards, devices)
            options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
            metadata = tf.compat.v1.RunMetadata()
            with tf.compat.v1.Session(config=towers.session_config()) as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                fetches = [[g for g in grads if g is not None] for _, _, grads in results]
                sess.run(fetches, options=options, run_metadata=metadata)
            var_devices = {test_util.local_device(v.device) for v in model.variables}
            op_types = {
                op.name: op.type for op in tf.compat.v1.get_default_graph().get_operations()
            }
        ran_on = {}
        for dev_stats in metadata.step_stats.dev_stats:
            if not re.search(r"device:[A-Z]+:\d+$", dev_stats.device):
                continue  # a GPU's streams and copies ("GPU:0/stream:14", "GPU:0/memcpy")
            for node in dev_stats.node_stats:
                ran_on[node.node_name] = test_util.local_device(dev_stats.device)
        self.assertEqual(var_devices, {"/device:CPU:0"})
        for i, device in enumerate(devices):
            pattern = re.compile(rf"(^|/)tower_{i}/")
            nodes = {
                n: d
                for n, d in ran_on.items()
                if pattern.search(n) and op_types.get(n) not in (None, *_VARIABLE_READS)
            }
            self.assertGreater(len(nodes), 10)
            self.assertEqual({n: d for n, d in nodes.items() if d != device}, {}, f"tower {i}")


if __name__ == "__main__":
    tf.test.main()
