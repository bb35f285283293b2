import numpy as np
import tensorflow as tf
from absl.testing import parameterized

import towers
from tests import test_util

STEPS = 20


def _reference_run(batches, learning_rate=0.1, momentum=0.0):
    """The same model trained by hand on one device: whole batches, a plain update."""
    model = test_util.Model()
    step = test_util.reference_step(model, test_util.loss_fn(model), learning_rate, momentum)
    results = [step(b) for b in batches]
    return model, results


def _towers_run(batches, k, learning_rate=0.1, momentum=0.0, signature=None, **kwargs):
    model = test_util.Model()
    optimizer = towers.SGD(learning_rate, momentum)
    devices = test_util.devices(k)

    @tf.function(input_signature=signature)
    def step(batch):
        return towers.train_step(
            test_util.loss_fn(model), model, optimizer, batch, devices, **kwargs
        )

    results = [step(b) for b in batches]
    return model, results


def _assert_same_weights(model, reference, rtol=1e-5):
    for got, want in zip(model.trainable_variables, reference.trainable_variables):
        test_util.assert_allclose(got, want, rtol=rtol, atol=1e-6)


class TrainStepTest(tf.test.TestCase, parameterized.TestCase):
    _references = {}  # batch size: the hand-written run, shared by the tower counts

    # K=1 the identity; 2, 3 and 8 towers on 24 examples (even shards) and 11 (uneven: 6+5,
    # 4+4+3, 3x2+5x1). (4 towers took no path of their own; test_dynamic_batch_size has 4.)
    @parameterized.product(k=[1, 2, 3, 8], batch=[24, 11])
    def test_steps_equal_single_device_steps(self, k, batch):
        batches = [test_util.batch(batch, seed=i) for i in range(STEPS)]
        if batch not in self._references:
            self._references[batch] = _reference_run(batches)
        reference, ref_results = self._references[batch]
        model, results = _towers_run(batches, k)
        _assert_same_weights(model, reference)
        for (loss, logits), (ref_loss, ref_logits) in zip(results, ref_results):
            test_util.assert_allclose(loss, ref_loss, rtol=1e-5)
            test_util.assert_allclose(logits, ref_logits, rtol=1e-5, atol=1e-5)
        self.assertAllEqual(model.unused, tf.ones([2]))  # None gradient: never updated

    @parameterized.parameters("ps", "replicated")
    def test_float64_relu_steps_equal_one_device_to_float64_round_off(self, strategy):
        """How a user checks the promise where float32 cannot: a ReLU input within float32
        round-off of 0 takes either side depending on the split; in float64 none does."""

        class ReLUNet(tf.Module):
            def __init__(self):
                rng = np.random.default_rng(0)
                self.w1 = tf.Variable(rng.normal(size=(6, 32)), name="w1")
                self.w2 = tf.Variable(rng.normal(size=(32, 3)), name="w2")

            def __call__(self, x):
                return tf.nn.relu(tf.cast(x, tf.float64) @ self.w1) @ self.w2

        def loss_fn(model):
            def fn(batch):
                inputs, labels = batch
                logits = model(inputs["features"])
                # (Not sparse_softmax_cross_entropy_with_logits: no float64 kernel on GPUs.)
                chosen = tf.one_hot(labels, 3, dtype=tf.float64) * tf.nn.log_softmax(logits)
                return -tf.reduce_mean(tf.reduce_sum(chosen, axis=-1))

            return fn

        batches = [test_util.batch(10, seed=i) for i in range(5)]
        reference = ReLUNet()
        step = test_util.reference_step(reference, loss_fn(reference), 0.05)
        for b in batches:
            step(b)
        devices = test_util.devices(4)
        if strategy == "ps":
            model = ReLUNet()
            local = lambda: model  # noqa: E731
        else:
            model = towers.Replicated(ReLUNet, devices)
            local = model.local
        optimizer = towers.SGD(0.05)
        towers_step = tf.function(
            lambda b: towers.train_step(lambda s: loss_fn(local())(s), model, optimizer, b, devices)
        )
        for b in batches:
            towers_step(b)
        trained = model.replicas[0] if strategy == "replicated" else model
        for got, want in zip(trained.trainable_variables, reference.trainable_variables):
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)

    def test_stateful_optimizer_equals_single_device(self):
        batches = [test_util.batch(11, seed=i) for i in range(STEPS)]
        reference, _ = _reference_run(batches, momentum=0.9)
        model, _ = _towers_run(batches, 3, momentum=0.9)
        _assert_same_weights(model, reference)

    def test_dynamic_batch_size(self):
        batches = [test_util.batch(n, seed=n) for n in (11, 16, 9, 13)]
        signature = [
            tf.nest.map_structure(
                lambda t: tf.TensorSpec([None, *t.shape[1:]], t.dtype), batches[0]
            )
        ]
        reference, _ = _reference_run(batches)
        model, results = _towers_run(batches, 4, signature=signature)
        _assert_same_weights(model, reference)
        self.assertEqual([r[1].shape[0] for r in results], [11, 16, 9, 13])

    def test_gradient_hook_sees_averaged_gradients_and_controls_the_update(self):
        full = test_util.batch(11)
        expected, _ = test_util.reference_gradients(test_util.Model(), full)
        seen = {}

        def freeze_w2(grads, variables):
            seen.update(grads=grads, names=[v.name for v in variables])
            return [None if v.name.startswith("w2") else g for g, v in zip(grads, variables)]

        model = test_util.Model()
        devices = test_util.devices(3)
        towers.train_step(
            test_util.loss_fn(model), model, towers.SGD(0.1), full, devices, gradient_hook=freeze_w2
        )
        for got, want in zip(seen["grads"], expected):
            if want is not None:
                test_util.assert_allclose(test_util.dense(got), test_util.dense(want))
        self.assertAllEqual(model.w2, _initial(model, "w2"))
        self.assertNotAllClose(model.w1, _initial(model, "w1"))

    @parameterized.parameters("ps", "replicated")
    def test_the_hook_sees_slices_whose_norm_is_the_gradients(self, strategy):
        """Before: repeated rows made tf.clip_by_global_norm measure 0.416 for 0.487."""
        devices = test_util.devices(2)
        if strategy == "replicated":  # (rows gathered, as "auto" does but on one split GPU)
            model = towers.Replicated(test_util.built_model, devices, sparse="gather")
            loss_fn = lambda b: test_util.loss_fn(model.local())(b)  # noqa: E731
        else:
            model = test_util.built_model()
            loss_fn = test_util.loss_fn(model)
        seen = []

        def hook(grads, variables):
            sparse = [g for g in grads if isinstance(g, tf.IndexedSlices)]
            dense = [tf.convert_to_tensor(g) if g is not None else None for g in grads]
            seen.append(
                (
                    [tf.size(g.indices) - tf.size(tf.unique(g.indices)[0]) for g in sparse],
                    tf.linalg.global_norm(grads),
                    tf.linalg.global_norm(dense),
                )
            )
            return grads

        @tf.function
        def step(batch):
            towers.train_step(loss_fn, model, towers.SGD(0.1), batch, devices, gradient_hook=hook)
            return seen[-1]

        batch = test_util.batch(16)  # 32 ids from a small vocabulary: rows repeat
        repeats, norm, dense_norm = step(batch)
        self.assertNotEmpty(repeats)
        self.assertEqual([int(r) for r in repeats], [0] * len(repeats))
        self.assertAllClose(norm, dense_norm, rtol=1e-6)

    def test_gradient_hook_returning_the_wrong_count(self):
        model = test_util.Model()
        with self.assertRaisesRegex(ValueError, "must return a list of 5 gradients"):
            towers.train_step(
                test_util.loss_fn(model),
                model,
                towers.SGD(0.1),
                test_util.batch(4),
                test_util.devices(2),
                gradient_hook=lambda grads, variables: grads[:2],
            )

    @parameterized.parameters(
        ((3, 2), tf.float32, r"float32\(3, 2\) gradient for variable w1:0 of float32\(10, 8\)"),
        ((10, 8), tf.float16, r"float16\(10, 8\) gradient for variable w1:0 of float32"),
    )
    def test_gradient_hook_returning_a_wrong_shape_or_dtype(self, shape, dtype, message):
        model = test_util.Model()
        model(test_util.batch(1)[0])
        before = [v.numpy() for v in model.variables]

        def bad(grads, variables):
            return [
                tf.zeros(shape, dtype) if v.name == "w1:0" else g for g, v in zip(grads, variables)
            ]

        step = tf.function(
            lambda b: towers.train_step(
                test_util.loss_fn(model),
                model,
                towers.SGD(0.1, momentum=0.9),
                b,
                test_util.devices(2),
                gradient_hook=bad,
            )
        )
        with self.assertRaisesRegex(ValueError, message):
            step(test_util.batch(4))
        for got, want in zip(model.variables, before):  # refused before anything ran
            self.assertAllEqual(got, want)

    def test_gradient_hook_returning_bad_rows(self):
        model = test_util.Model()
        model(test_util.batch(1)[0])
        before = [v.numpy() for v in model.variables]

        def rows(indices, dtype=tf.int32):
            def hook(grads, variables):
                out = []
                for g, v in zip(grads, variables):
                    if v.name == "embedding:0":
                        g = tf.IndexedSlices(
                            tf.ones([len(indices), 4]), tf.constant(indices, dtype)
                        )
                    out.append(g)
                return out

            return hook

        optimizer = towers.SGD(0.1, momentum=0.9)
        optimizer.build(model.trainable_variables)

        def step(hook):
            towers.train_step(
                test_util.loss_fn(model),
                model,
                optimizer,
                test_util.batch(4),
                test_util.devices(2),
                gradient_hook=hook,
            )

        with self.assertRaisesRegex(ValueError, "indices must be one int32 or int64 row index"):
            step(rows([1.0, 2.0], tf.float32))
        for bad in ([1, 99], [-1, 2]):
            with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "row indices outside"):
                tf.function(step)(rows(bad))
            for got, want in zip(model.variables, before):  # no variable changed
                self.assertAllEqual(got, want)
        with self.assertRaisesRegex(TypeError, "`gradient_hook` must be callable; got 'clip'"):
            step("clip")

    def test_ops_without_a_gpu_kernel_are_built_on_the_host(self):
        """Asserts (finiteness, rows, batch sizes) go to CPU:0, not the towers' devices."""
        devices = test_util.devices(8)[5:]
        replicas = towers.Replicated(test_util.built_model, devices)

        def hook(grads, variables):  # IndexedSlices the hook makes get their rows checked
            rows = tf.range(test_util.VOCAB)
            return [
                tf.IndexedSlices(g, rows) if "embedding" in v.name else g
                for g, v in zip(grads, variables)
            ]

        @tf.function
        def step(batch):
            return towers.train_step(
                lambda b: test_util.loss_fn(replicas.local())(b),
                replicas,
                towers.SGD(0.1),
                batch,
                devices,
                gradient_hook=hook,
                split_device=devices[0],
            )

        spec = tf.nest.map_structure(
            lambda t: tf.TensorSpec([None, *t.shape[1:]], t.dtype), test_util.batch(6)
        )
        graph = step.get_concrete_function(spec).graph
        asserts = [op for op in graph.get_operations() if op.type == "Assert"]
        # Finiteness per copy, rows of the embedding per copy, batch sizes: 3, 3 and 2 or more.
        self.assertGreaterEqual(len(asserts), 3 + 3 * 2 + 2)
        self.assertEqual({test_util.local_device(op.device) for op in asserts}, {"/device:CPU:0"})

    def test_no_variable_gets_a_gradient(self):
        model = test_util.Model()

        def constant_loss(batch):
            model(batch[0])
            return tf.constant(1.0)

        with self.assertRaisesRegex(
            ValueError, r"No variable gets a gradient from the loss: \['b1:0', 'embedding:0'"
        ):
            towers.train_step(
                constant_loss, model, towers.SGD(0.1), test_util.batch(4), test_util.devices(2)
            )

    @parameterized.parameters(
        (lambda out: None, "got NoneType. Did it forget to return"),
        (lambda out: (out[0], out[1], out[1]), "a pair \\(loss, outputs\\); got a tuple of 3"),
        (lambda out: "loss", "floating scalar tensor .* got str"),
    )
    def test_loss_fn_returning_something_else(self, transform, message):
        model = test_util.Model()

        def loss_fn(batch):
            return transform(test_util.loss_fn(model)(batch))

        with self.assertRaisesRegex(ValueError, message):
            towers.train_step(
                loss_fn, model, towers.SGD(0.1), test_util.batch(4), test_util.devices(2)
            )

    def test_loss_must_be_a_scalar(self):
        model = test_util.Model()

        def per_example_loss(batch):
            return tf.reduce_sum(model(batch[0]), axis=1)

        with self.assertRaisesRegex(ValueError, r"floating scalar.*shape \(2,\)"):
            towers.train_step(
                per_example_loss, model, towers.SGD(0.1), test_util.batch(4), test_util.devices(2)
            )

    def test_loss_only_and_a_variable_list(self):
        model = test_util.Model()
        model(test_util.batch(1)[0])  # build
        loss_only = lambda batch: test_util.loss_fn(model)(batch)[0]  # noqa: E731
        loss, outputs = towers.train_step(
            loss_only,
            list(model.trainable_variables),
            towers.SGD(0.1),
            test_util.batch(6),
            test_util.devices(3),
        )
        self.assertIsNone(outputs)
        self.assertEqual(loss.shape, [])

    def test_bad_variables(self):
        with self.assertRaisesRegex(ValueError, "non-empty list of tf.Variable"):
            towers.train_step(
                lambda b: tf.reduce_mean(b),
                [],
                towers.SGD(0.1),
                tf.zeros([4]),
                test_util.devices(2),
            )

    def test_v1_session_equals_single_device(self):
        batches = [test_util.batch(11, seed=i) for i in range(5)]
        reference, _ = _reference_run(batches)
        with tf.Graph().as_default():
            model = test_util.Model()
            placeholders = tf.nest.map_structure(
                lambda t: tf.compat.v1.placeholder(t.dtype, [None, *t.shape[1:]]), batches[0]
            )
            loss, _ = towers.train_step(
                test_util.loss_fn(model), model, towers.SGD(0.1), placeholders, test_util.devices(3)
            )
            with tf.compat.v1.Session(config=towers.session_config()) as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                for batch in batches:
                    feed = dict(
                        zip(
                            tf.nest.flatten(placeholders),
                            [t.numpy() for t in tf.nest.flatten(batch)],
                        )
                    )
                    sess.run(loss, feed)
                weights = sess.run(model.trainable_variables)
        for got, want in zip(weights, reference.trainable_variables):
            test_util.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _initial(model, name):
    fresh = test_util.Model(seed=model.seed)
    fresh(test_util.batch(1)[0])
    return getattr(fresh, name)


if __name__ == "__main__":
    tf.test.main()
