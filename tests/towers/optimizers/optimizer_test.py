"""The optimizer base: state named like weight files, per copy, on each variable's device."""

import os

import numpy as np
import tensorflow as tf
from absl.testing import parameterized

import towers
from tests import test_util
from tests.towers.optimizers import rules_test as optimizers_test
from towers.ops.internal import in_programs


class TwoBetas(tf.Module):
    """Two variables both named "beta": ordinary in a model, fatal for name-keyed state."""

    def __init__(self):
        super().__init__()
        self.first = tf.Variable(tf.ones([3]), name="beta")
        self.second = tf.Variable(tf.ones([3]) * 2.0, name="beta")

    def __call__(self, x):
        return tf.reduce_sum(x * self.first + x * x * self.second, axis=1)


def _build():
    model = test_util.Model()
    model(test_util.batch(1)[0])
    return model


class StateTest(tf.test.TestCase, parameterized.TestCase):
    def test_state_is_named_by_the_model_not_by_variable_names(self):
        model = TwoBetas()
        optimizer = towers.Adam(0.1)

        @tf.function
        def step(x):
            return towers.train_step(
                lambda b: tf.reduce_mean(model(b)), model, optimizer, x, test_util.devices(2)
            )

        step(tf.ones([4, 3]))
        self.assertEqual(
            sorted(optimizer.variable_copies()),
            [
                "optimizer/iterations",
                "slots/first/m",
                "slots/first/v",
                "slots/second/m",
                "slots/second/v",
            ],
        )

    def test_without_build_names_come_from_variables_made_unique(self):
        first, second = tf.Variable(1.0, name="beta"), tf.Variable(2.0, name="beta")
        optimizer = towers.SGD(0.1, momentum=0.9)
        optimizer.apply_gradients([(tf.constant(1.0), first), (tf.constant(1.0), second)])
        self.assertEqual(
            sorted(optimizer.variable_copies()), ["slots/beta/momentum", "slots/beta_1/momentum"]
        )
        optimizer.build({"a": first, "b": second})  # a model's names win afterwards
        self.assertEqual(
            sorted(optimizer.variable_copies()), ["slots/a/momentum", "slots/b/momentum"]
        )

    def test_replicated_copies_have_their_own_state_on_their_devices(self):
        devices = test_util.devices(8)[5:]
        replicas = towers.Replicated(_build, devices)
        optimizer = towers.Adam(0.01)
        optimizer.build(replicas)
        copies = optimizer.variable_copies()
        self.assertLen(copies["optimizer/iterations"], 3)
        for i, device in enumerate(devices):
            self.assertEqual(test_util.local_device(copies["slots/w1/m"][i].device), device)
            self.assertEqual(
                test_util.local_device(copies["optimizer/iterations"][i].device), device
            )

        @tf.function
        def step(batch):
            return towers.train_step(
                lambda b: test_util.loss_fn(replicas.local())(b),
                replicas,
                optimizer,
                batch,
                devices,
            )

        graph = step.get_concrete_function(test_util.batch(6)).graph
        adam = [op for op in graph.get_operations() if op.type == "ResourceApplyAdam"]
        if in_programs(devices[0]):  # (uncompiled on a GPU: each copy's update is a program)
            adam = [op for op in graph.get_operations() if "__inference_update_" in _called(op)]
        else:
            self.assertLen(adam, 3 * 4)  # 4 variables with dense gradients (embedding: sparse)
        self.assertEqual(sorted({test_util.local_device(op.device) for op in adam}), devices)

    def test_arguments_are_checked_where_given(self):
        for make, error, message in [
            (lambda: towers.Adam(beta_1=1.0), ValueError, r"`beta_1` must be .* in \[0, 1\)"),
            (lambda: towers.Adam(epsilon=0.0), ValueError, "`epsilon` must be a finite number > 0"),
            # 0 in float32: a zero gradient's update was 0 / 0, NaN.
            (lambda: towers.Adam(epsilon=1e-46), ValueError, "must stay > 0 in float32"),
            (lambda: towers.RMSProp(epsilon=1e-46), ValueError, "must stay > 0 in float32"),
            (lambda: towers.Adagrad(epsilon=1e-46), ValueError, "must stay > 0 in float32"),
            (lambda: towers.RMSProp(rho="x"), TypeError, "`rho` must be a finite number"),
            (lambda: towers.Adagrad(initial_accumulator_value=0), ValueError, "number > 0"),
            (lambda: towers.LARS(eta=0.0), ValueError, "`eta` must be a finite number > 0"),
            (lambda: towers.AdamW(weight_decay=-1), ValueError, "`weight_decay` must be a"),
            (lambda: towers.LAMB("fast"), TypeError, "`learning_rate` must be a number"),
            (lambda: towers.SGD(0.1, momentum=1.0), ValueError, r"`momentum` .* got 1.0"),
            (lambda: towers.SGD(float("nan")), ValueError, "`learning_rate` must be a finite"),
            (lambda: towers.SGD(0.1, nesterov=1), TypeError, "`nesterov` must be True or False"),
        ]:
            with self.assertRaisesRegex(error, message):
                make()

    def test_the_stage_by_stage_api_gives_each_copy_its_own_state(self):
        devices = test_util.devices(2)
        replicas = towers.Replicated(_build, devices)
        optimizer = towers.Adam(0.01)

        @tf.function
        def step(batch):
            tower_grads = towers.replicate(
                lambda b: towers.tower_gradients(test_util.loss_fn(replicas.local()), replicas, b)[
                    2
                ],
                towers.ops.split_batch(batch, 2),
                devices,
                variable_strategy=replicas,
            )
            towers.apply_replicated(replicas, tower_grads, [3, 2], optimizer)

        for i in range(3):
            step(test_util.batch(5, seed=i))
        self.assertEqual([int(c) for c in optimizer.iterations.values()], [3, 3])
        self.assertIn("slots/w1/m", optimizer.variable_copies())
        towers.check_replicas_identical(replicas)

    def test_numpy_numbers_are_numbers_and_a_schedule_takes_the_step(self):
        towers.SGD(np.float32(0.1), momentum=np.float32(0.9))
        towers.Adam(np.float64(0.001), beta_1=np.float16(0.5))
        with self.assertRaisesRegex(TypeError, "cannot take one argument. Write `lambda step"):
            towers.Adam(lambda: 0.1)

    def test_a_dtype_that_rounds_a_decay_to_one_is_refused(self):
        var = tf.Variable(tf.ones([3], tf.bfloat16), name="w")
        for optimizer in (towers.Adam(0.1), towers.LAMB(0.1)):
            with self.assertRaisesRegex(ValueError, r"`beta_2`=0.999 rounds to 1.0 in bfloat16"):
                optimizer.apply_gradients([(tf.ones([3], tf.bfloat16), var)])
        towers.SGD(0.5).apply_gradients([(tf.ones([3], tf.bfloat16), var)])
        self.assertAllEqual(var, [0.5, 0.5, 0.5])

    def test_a_number_rate_reaches_a_float64_variable_unrounded(self):
        """0.05 through float32 is 0.05000000075: a float64 model would drift by 1.5e-8."""
        var = tf.Variable(np.ones(3), dtype=tf.float64)
        grad = np.array([1.0, 3.0, 1e8])
        towers.SGD(0.05).apply_gradients([(tf.constant(grad), var)])
        np.testing.assert_array_equal(var.numpy(), 1.0 - 0.05 * grad)

    def test_a_rule_sees_the_1_based_step_count_without_asking_for_it(self):
        class StepAsValue(towers.Optimizer):
            def update(self, grad, var, slots, lr, step):
                return var.assign(tf.fill(var.shape, step))

        var = tf.Variable([0.0, 0.0])
        optimizer = StepAsValue(0.1, name="step_as_value")

        @tf.function
        def step():
            optimizer.apply_gradients([(tf.ones([2]), var)])

        for expected in (1.0, 2.0, 3.0):
            step()
            self.assertAllEqual(var, [expected, expected])

    def test_adamw_can_exclude_vectors_whatever_their_name(self):
        """GPT-style names ("ln_1") match neither "bias" nor "norm"; rank excludes them."""

        class Block(tf.Module):
            def __init__(self):
                super().__init__(name="block")
                self.ln_1 = tf.Module()
                self.ln_1.gamma = tf.Variable(tf.ones([3]))
                self.kernel = tf.Variable(tf.ones([3, 3]))

        for below, vector in ((0, 1 - 0.1 * 0.5), (2, 1.0)):
            block = Block()
            optimizer = towers.AdamW(0.1, weight_decay=0.5, exclude_rank_below=below)
            variables = [block.ln_1.gamma, block.kernel]
            optimizer.build(block)
            optimizer.apply_gradients([(tf.zeros_like(v), v) for v in variables])
            self.assertAllClose(block.ln_1.gamma, [vector] * 3)
            self.assertAllClose(block.kernel, tf.fill([3, 3], 1 - 0.1 * 0.5))
        with self.assertRaisesRegex(ValueError, "`exclude_rank_below` must be an int >= 0"):
            towers.AdamW(exclude_rank_below=-1)

    def test_a_rule_is_one_short_class(self):
        class SignSGD(towers.Optimizer):
            def update(self, grad, var, slots, lr, step):
                return var.assign_sub(lr * tf.sign(grad))

        var = tf.Variable([1.0, -1.0])
        SignSGD(0.5, name="sign").apply_gradients([(tf.constant([3.0, -0.1]), var)])
        self.assertAllEqual(var, [0.5, -0.5])


class ResumeTest(tf.test.TestCase):
    def test_adam_with_warmup_cosine_resumes_on_another_tower_count(self):
        """Saved after 3 steps on 2 replicated towers, resumed on 3: the uninterrupted run.

        With a dynamic loss scale (powers of two: exact for finite float32 gradients) that
        grows every 2 steps: its scale and counts resume too.
        """

        def schedule():
            return towers.schedules.LinearWarmup(2, towers.schedules.CosineDecay(0.01, 10))

        directory = os.path.join(self.get_temp_dir(), "run")
        reference = _numpy_adam_run(_build(), schedule(), 6)

        for k, start, stop in ((2, 0, 3), (3, 3, 6)):
            devices = test_util.devices(k)
            replicas = towers.Replicated(_build, devices)
            optimizer = towers.Adam(schedule())
            scale = towers.DynamicLossScale(2.0**10, growth_interval=2)
            with towers.CheckpointManager(
                directory, replicas, optimizer, extra={"loss_scale": scale}
            ) as manager:
                self.assertEqual(manager.restore_latest(), start)

                @tf.function
                def train(batch, replicas=replicas, optimizer=optimizer, devices=devices, s=scale):
                    return towers.train_step(
                        lambda b: test_util.loss_fn(replicas.local())(b),
                        replicas,
                        optimizer,
                        batch,
                        devices,
                        loss_scale=s,
                    )

                for i in range(start, stop):
                    train(test_util.batch(11, seed=i))
                manager.save(stop)
            towers.check_replicas_identical(optimizer)
        self.assertEqual(int(optimizer.iterations[2]), 6)
        self.assertEqual(float(scale.scale), 2.0**13)  # grown 3 times in 6 steps, not 2^11
        self.assertEqual(int(scale.skipped_steps), 0)
        for got, want in zip(replicas.replicas[1].variables, reference.variables):
            test_util.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _numpy_adam_run(model, schedule, steps):
    """Adam by hand (numpy) with the schedule, on one device, whole batches."""
    states = {v.name: {} for v in model.trainable_variables}
    for step in range(steps):
        with tf.GradientTape() as tape:
            loss, _ = test_util.loss_fn(model)(test_util.batch(11, seed=step))
        grads = tape.gradient(loss, model.trainable_variables)
        lr = float(schedule(step))
        for var, grad in zip(model.trainable_variables, grads):
            if grad is not None:
                new = optimizers_test.np_adam(
                    var.numpy().astype(np.float64),
                    test_util.dense(grad),
                    states[var.name],
                    step + 1,
                    lr,
                )
                var.assign(new.astype(np.float32))
    return model


def _called(op: tf.Operation) -> str:
    """The name of the function a call op runs ("" for other ops)."""
    return op.node_def.attr["f"].func.name if "f" in op.node_def.attr else ""


if __name__ == "__main__":
    tf.test.main()
