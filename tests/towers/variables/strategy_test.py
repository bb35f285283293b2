"""Strategies written against the `VariableStrategy` protocol work everywhere strategies go."""

import os

import tensorflow as tf

import towers
from tests import test_util
from towers import ops


def _build(seed=0):
    model = test_util.Model(seed)
    model(test_util.batch(1)[0])
    return model


class TwoCopies(towers.VariableStrategy):
    """Two copies of a model; the mean of the tower gradients is taken on the first device.

    The second copy is built in a "replica_1" name scope, as `Replicated` does: `towers.SGD`
    still tells copies apart by variable name.
    """

    def __init__(self, devices, seed=0):
        self.devices = devices
        self.copies = []
        for i, device in enumerate(devices):
            with tf.device(device), tf.name_scope(f"replica_{i}" if i else ""):
                self.copies.append(_build(seed))
        for first, second in zip(self.copies[0].variables, self.copies[1].variables):
            second.assign(first)

    def scope(self, tower):
        return tf.variable_creator_scope(_refuse)

    def tower_variables(self, model, tower):
        return list(self.copies[tower.index if tower else 0].trainable_variables)

    def reduce_gradients(self, model, tower_grads, weights):
        total = float(sum(weights))
        with tf.device(self.devices[0]):
            mean = [_mean(grads, weights, total) for grads in zip(*tower_grads)]
        reduced = []
        for copy, device in zip(self.copies, self.devices):
            with tf.device(device):
                grads = [None if g is None else tf.identity(g) for g in mean]
            reduced.append(towers.ReducedGradients(grads, list(copy.trainable_variables), device))
        return reduced

    def variable_copies(self, model):
        names = towers.named_variables(self.copies[0])
        second = list(towers.named_variables(self.copies[1]).values())
        return {name: (var, second[j]) for j, (name, var) in enumerate(names.items())}


def _mean(grads, weights, total):
    if grads[0] is None:
        return None
    return tf.add_n([tf.convert_to_tensor(g) * (w / total) for g, w in zip(grads, weights)])


def _refuse(next_creator, **kwargs):
    raise ValueError("TwoCopies builds its copies up front")


class OnTowerZero(towers.VariableStrategy):
    """One copy, on the first tower's device, created there by the first tower."""

    def scope(self, tower):
        def create(next_creator, **kwargs):
            if not tower.is_chief:
                raise ValueError("only tower 0 creates")
            return next_creator(**kwargs)

        return tf.variable_creator_scope(create)

    def tower_variables(self, model, tower):
        return list(model.trainable_variables)

    def reduce_gradients(self, model, tower_grads, weights):
        variables = self.tower_variables(model, None)
        return [towers.ReducedGradients(ops.average_gradients(tower_grads, weights), variables)]

    def variable_copies(self, model):
        return {name: (var,) for name, var in towers.named_variables(model).items()}


def _reference(steps, momentum=0.0):
    model = _build()
    step = test_util.reference_step(model, test_util.loss_fn(model), 0.1, momentum)
    for i in range(steps):
        step(test_util.batch(11, seed=i))
    return model


def _train(model, strategy, optimizer, devices, start, stop, local):
    def loss_fn(batch):
        return test_util.loss_fn(local())(batch)

    @tf.function
    def step(batch):
        return towers.train_step(
            loss_fn, model, optimizer, batch, devices, variable_strategy=strategy
        )

    for i in range(start, stop):
        step(test_util.batch(11, seed=i))


def _local(strategy):
    def local():
        tower = towers.current_tower()
        return strategy.copies[tower.index if tower else 0]

    return local


class CustomStrategyTest(tf.test.TestCase):
    def test_a_strategy_holding_copies_trains_saves_and_resumes(self):
        devices = test_util.devices(2)
        strategy = TwoCopies(devices)
        optimizer = towers.SGD(0.1, momentum=0.9)
        _train(strategy, None, optimizer, devices, 0, 5, _local(strategy))
        towers.check_replicas_identical(strategy)
        path = os.path.join(self.get_temp_dir(), "w.npz")
        towers.save_weights(strategy, path)
        self.assertEqual(
            sorted(towers.read_weights(path)), ["b1", "embedding", "unused", "w1", "w2"]
        )
        directory = os.path.join(self.get_temp_dir(), "run")
        towers.CheckpointManager(directory, strategy, optimizer).save(5)

        again = TwoCopies(devices, seed=4)
        optimizer = towers.SGD(0.1, momentum=0.9)
        self.assertEqual(towers.CheckpointManager(directory, again, optimizer).restore_latest(), 5)
        towers.check_replicas_identical(again)
        _train(again, None, optimizer, devices, 5, 10, _local(again))
        towers.check_replicas_identical(again)
        for got, want in zip(again.copies[1].variables, _reference(10, momentum=0.9).variables):
            test_util.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

        plain = _build(seed=9)
        towers.restore_weights(plain, path)
        for got, want in zip(plain.variables, strategy.copies[0].variables):
            self.assertAllEqual(got, want)

    def test_a_strategy_that_shards_state_is_asked_for_every_gradient_with_a_hook(self):
        """What `train_step` asks of a strategy is declared by the protocol, not looked up:
        `shard_optimizer_state` (default False) and `reduce_gradients(every_gradient=)`."""
        self.assertFalse(towers.VariableStrategy.shard_optimizer_state)
        devices = test_util.devices(2)

        class Sharding(TwoCopies):
            shard_optimizer_state = True
            asked = []

            def reduce_gradients(self, model, tower_grads, weights, *, every_gradient=False):
                self.asked.append(every_gradient)
                return super().reduce_gradients(model, tower_grads, weights)

        strategy = Sharding(devices)
        for hook in (None, lambda grads, variables: grads):
            towers.train_step(
                lambda b: test_util.loss_fn(_local(strategy)())(b),
                strategy.copies[0],
                towers.SGD(0.1),
                test_util.batch(4),
                devices,
                variable_strategy=strategy,
                gradient_hook=hook,
            )
        self.assertEqual(Sharding.asked, [False, True])
        # A strategy that does not shard is never passed the keyword (it may leave it out).
        plain = TwoCopies(devices)
        towers.train_step(
            lambda b: test_util.loss_fn(_local(plain)())(b),
            plain.copies[0],
            towers.SGD(0.1),
            test_util.batch(4),
            devices,
            variable_strategy=plain,
            gradient_hook=lambda grads, variables: grads,
        )

    def test_replicate_enters_the_strategy_scope(self):
        strategy = TwoCopies(test_util.devices(2))
        with self.assertRaisesRegex(ValueError, "TwoCopies builds its copies up front"):
            towers.replicate(
                lambda _: tf.Variable(1.0),
                [None, None],
                test_util.devices(2),
                variable_strategy=strategy,
            )

    def test_a_single_copy_strategy_for_a_module(self):
        devices = test_util.devices(8)[5:]
        model = test_util.Model()
        _train(model, OnTowerZero(), towers.SGD(0.1), devices, 0, 5, lambda: model)
        self.assertEqual({test_util.local_device(v.device) for v in model.variables}, {devices[0]})
        for got, want in zip(model.variables, _reference(5).variables):
            test_util.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


class ResolveTest(tf.test.TestCase):
    def test_tower_code_gets_the_strategy_its_tower_is_built_with(self):
        strategy = TwoCopies(test_util.devices(2))
        shards = ops.split_batch(test_util.batch(4), 2)

        def fn(shard):
            tower = towers.current_tower()
            self.assertIs(tower.variable_strategy, strategy)
            local = strategy.copies[tower.index]
            loss, _, grads = towers.tower_gradients(test_util.loss_fn(local), None, shard)
            return [g is not None for g in grads], towers.variable_list(None)

        results = towers.replicate(fn, shards, test_util.devices(2), variable_strategy=strategy)
        for i, (has_grad, variables) in enumerate(results):
            self.assertEqual(has_grad, [True, True, False, True, True])
            self.assertEqual(variables, list(strategy.copies[i].trainable_variables))

    def test_a_module_attribute_named_like_a_method_is_just_a_name(self):
        model = _build()
        model.variable_copies = 3
        path = os.path.join(self.get_temp_dir(), "w.npz")
        towers.save_weights(model, path)
        self.assertIn("w1", towers.read_weights(path))

    def test_bad_strategies(self):
        model = test_util.Model()
        with self.assertRaisesRegex(TypeError, "must be a towers.VariableStrategy .* got str"):
            towers.train_step(
                test_util.loss_fn(model),
                model,
                towers.SGD(0.1),
                test_util.batch(4),
                test_util.devices(2),
                variable_strategy="/cpu:0",
            )
        replicas = towers.Replicated(_build, test_util.devices(2))
        with self.assertWarnsRegex(UserWarning, "is ignored: the model is a Replicated"):
            towers.train_step(
                lambda b: test_util.loss_fn(replicas.local())(b),
                replicas,
                towers.SGD(0.1),
                test_util.batch(4),
                test_util.devices(2),
                variable_strategy=towers.ParameterServer(),
            )
        with self.assertRaisesRegex(ValueError, "holds its own copies of the model; pass it as"):
            towers.train_step(
                lambda b: test_util.loss_fn(replicas.local())(b),
                model,
                towers.SGD(0.1),
                test_util.batch(4),
                test_util.devices(2),
                variable_strategy=replicas,
            )

    def test_sends_narrow_follows_the_documented_attributes(self):
        """A strategy of one's own sends two towers' exact half-precision gradients narrow
        by default, not with sharded state (a reduce-scatter sends float32) nor with a
        `wire_dtype` (its cast decides); the built-in ones add their own conditions."""
        strategy = OnTowerZero()
        self.assertEqual([strategy.sends_narrow(k) for k in (1, 2, 3)], [False, True, False])
        strategy.shard_optimizer_state = True
        self.assertFalse(strategy.sends_narrow(2))
        strategy = OnTowerZero()
        strategy.wire_dtype = tf.bfloat16
        self.assertFalse(strategy.sends_narrow(2))
        devices = test_util.devices(2)
        self.assertTrue(towers.Replicated(test_util.built_model, devices).sends_narrow(2))
        self.assertFalse(
            towers.Replicated(test_util.built_model, devices, wire_dtype=tf.bfloat16).sends_narrow(
                2
            )
        )
        self.assertTrue(towers.ParameterServer().sends_narrow(2))
        self.assertFalse(towers.ParameterServer(bucket_bytes=None).sends_narrow(2))

    def test_the_protocol_is_enforced(self):
        class Partial(towers.VariableStrategy):
            def scope(self, tower):
                return tf.variable_creator_scope(lambda next_creator, **kw: next_creator(**kw))

        # Python 3.12 quotes the names ("abstract methods 'reduce_gradients', ..."), 3.11 not.
        with self.assertRaisesRegex(
            TypeError, "abstract methods '?reduce_gradients'?, '?tower_variables'?, '?variable_c"
        ):
            Partial()


if __name__ == "__main__":
    tf.test.main()
