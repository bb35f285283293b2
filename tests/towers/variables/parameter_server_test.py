import tensorflow as tf
from absl.testing import parameterized

import towers
from tests import test_util
from towers import ops


class ParameterServerTest(tf.test.TestCase, parameterized.TestCase):
    def test_variables_live_on_the_parameter_server_not_the_tower(self):
        model = test_util.Model()
        shards = ops.split_batch(test_util.batch(6), 3)
        towers.replicate(model, [s[0] for s in shards], test_util.devices(8)[5:])
        for var in model.variables:
            self.assertEqual(test_util.local_device(var.device), "/device:CPU:0", var.name)

    def test_parameter_server_on_another_device(self):
        model = test_util.Model()
        strategy = towers.ParameterServer("/cpu:7")
        towers.replicate(model, [test_util.batch(2)[0]], ["/cpu:0"], variable_strategy=strategy)
        self.assertEqual(
            {test_util.local_device(v.device) for v in model.variables}, {"/device:CPU:7"}
        )

    def test_spread_by_size_least_loaded_first(self):
        sizes = [100, 60, 50, 30, 20, 10]
        strategy = towers.ParameterServer(devices=test_util.devices(3))

        def fn(_):
            return [tf.Variable(tf.zeros([n]), name=f"v{n}") for n in sizes]

        (created,) = towers.replicate(fn, [None], ["/cpu:0"], variable_strategy=strategy)
        placed = [test_util.local_device(v.device)[-1] for v in created]
        # Greedy by bytes: 100->0, 60->1, 50->2, 30->2 (200 B), 20->1 (240 B), then 1 and 2
        # tie at 320 B and the first of them takes 10.
        self.assertEqual(placed, ["0", "1", "2", "2", "1", "1"])
        self.assertEqual(list(strategy.load().values()), [400, 360, 320])

    def test_spread_with_callable_initial_values(self):
        strategy = towers.ParameterServer(devices=test_util.devices(2))

        def fn(_):
            return [tf.Variable(lambda: tf.zeros([8])), tf.Variable(lambda: tf.zeros([4]))]

        (created,) = towers.replicate(fn, [None], ["/cpu:0"], variable_strategy=strategy)
        self.assertEqual([test_util.local_device(v.device) for v in created], test_util.devices(2))
        self.assertEqual(list(strategy.load().values()), [32, 16])

    def test_a_device_that_does_not_exist_is_an_error_when_towers_are_built(self):
        strategy = towers.ParameterServer(devices=["/cpu:0", "/gpu:9"])  # 8 in the GPU tier
        model = test_util.Model()
        with self.assertRaisesRegex(
            ValueError, r"'/device:GPU:9' in `ParameterServer\(devices=...\)` does not exist"
        ):
            towers.train_step(
                test_util.loss_fn(model),
                model,
                towers.SGD(0.1),
                test_util.batch(4),
                test_util.devices(2),
                variable_strategy=strategy,
            )
        self.assertEqual(model.variables, ())  # nothing was created on CPU:0 instead

    @parameterized.parameters(256, None, "default")
    def test_packed_or_not_gradients_train_like_one_device(self, bucket_bytes):
        """Variables spread over two devices; each tower packs its gradients per device."""
        devices = test_util.devices(3)
        model = test_util.Model()  # its variables are made in the first tower, spread
        strategy = (
            towers.ParameterServer(["/cpu:6", "/cpu:7"])
            if bucket_bytes == "default"
            else towers.ParameterServer(["/cpu:6", "/cpu:7"], bucket_bytes=bucket_bytes)
        )
        reference = test_util.built_model()
        reference_step = test_util.reference_step(
            reference, test_util.loss_fn(reference), 0.1, momentum=0.9
        )
        optimizer = towers.SGD(0.1, momentum=0.9)

        @tf.function
        def step(batch):
            loss_fn = lambda b: test_util.loss_fn(model)(b)  # noqa: E731
            return towers.train_step(
                loss_fn, model, optimizer, batch, devices, variable_strategy=strategy
            )

        for i in range(5):
            step(test_util.batch(11, seed=i))
            reference_step(test_util.batch(11, seed=i))
        self.assertLen({v.device for v in model.variables}, 2)
        mine, theirs = towers.named_variables(model), towers.named_variables(reference)
        self.assertEqual(sorted(mine), sorted(theirs))
        for name, var in mine.items():
            test_util.assert_allclose(var, theirs[name], rtol=1e-5, atol=1e-6)

    def test_by_default_small_gradients_cross_packed_and_a_large_one_alone(self):
        """21 small gradients per tower reach the variables' device in one buffer, not 21."""

        class Wide(tf.Module):
            def __init__(self):
                super().__init__()
                self.biases = [tf.Variable(tf.zeros([4]), name=f"b{i}") for i in range(20)]
                self.kernel = tf.Variable(tf.ones([4, 5000]) * 1e-3, name="kernel")  # 80 KB
                self.scale = tf.Variable([1.0], name="scale")  # after the kernel, packed too

            def __call__(self, x):
                for b in self.biases:
                    x = tf.tanh(x + b)
                return tf.reduce_mean(tf.matmul(x, self.kernel) ** 2 * self.scale)

        towers_ = test_util.devices(5)[1:]

        def crossings(strategy):
            with tf.device("/cpu:0"):  # where the default strategy keeps them (not GPU:0)
                model = Wide()

            @tf.function
            def step(x):
                return towers.train_step(
                    lambda shard: model(shard[0]),
                    model,
                    towers.SGD(0.1),
                    (x,),
                    towers_,
                    variable_strategy=strategy,
                )[0]

            graph = step.get_concrete_function(tf.TensorSpec([8, 4])).graph
            flattened = [
                op
                for op in graph.get_operations()
                if op.type == "Reshape" and op.inputs[0].shape == (4, 5000)
            ]
            self.assertEqual(flattened, [])  # the kernel's gradient crosses as it is
            count = 0
            for op in graph.get_operations():
                if test_util.local_device(op.device) != "/device:CPU:0":
                    continue
                count += sum(
                    test_util.local_device(t.op.device) in towers_
                    for t in op.inputs
                    if t.dtype == tf.float32 and t.shape.rank  # gradients, not the losses
                )
            return count

        self.assertEqual(crossings(towers.ParameterServer()), 4 * 2)  # 1 buffer + the kernel
        self.assertEqual(crossings(towers.ParameterServer(bucket_bytes=None)), 4 * 22)

    def test_bad_arguments(self):
        with self.assertRaisesRegex(ValueError, "`devices` must name at least one device"):
            towers.ParameterServer([])
        with self.assertRaisesRegex(ValueError, "`bucket_bytes` must be an int >= 1 or None"):
            towers.ParameterServer(bucket_bytes=0)


if __name__ == "__main__":
    tf.test.main()
