"""Every optimizer against a numpy implementation of its rule, alone and in a K-tower step."""

import numpy as np
import tensorflow as tf
from absl.testing import parameterized

import towers
from tests import test_util
from towers.ops.internal import in_programs


def np_sgd(w, g, s, t, lr, momentum=0.0, nesterov=False):
    if not momentum:
        return w - lr * g
    s["m"] = momentum * s.get("m", 0.0) + g
    return w - lr * (g + momentum * s["m"]) if nesterov else w - lr * s["m"]


def np_adam(w, g, s, t, lr, beta_1=0.9, beta_2=0.999, epsilon=1e-7):
    s["m"] = beta_1 * s.get("m", 0.0) + (1 - beta_1) * g
    s["v"] = beta_2 * s.get("v", 0.0) + (1 - beta_2) * g * g
    rate = lr * np.sqrt(1 - beta_2**t) / (1 - beta_1**t)
    return w - rate * s["m"] / (np.sqrt(s["v"]) + epsilon)


def np_adamw(w, g, s, t, lr, weight_decay=0.004, excluded=False, **adam):
    if not excluded:
        w = w - lr * weight_decay * w
    return np_adam(w, g, s, t, lr, **adam)


def np_rmsprop(w, g, s, t, lr, rho=0.9, momentum=0.0, epsilon=1e-7, centered=False):
    s["ms"] = rho * s.get("ms", 0.0) + (1 - rho) * g * g
    denominator = s["ms"]
    if centered:
        s["mg"] = rho * s.get("mg", 0.0) + (1 - rho) * g
        denominator = s["ms"] - s["mg"] ** 2
    s["mom"] = momentum * s.get("mom", 0.0) + lr * g / np.sqrt(denominator + epsilon)
    return w - s["mom"]


def np_adagrad(w, g, s, t, lr, initial_accumulator_value=0.1, epsilon=1e-7):
    s["a"] = s.get("a", initial_accumulator_value) + g * g
    return w - lr * g / (np.sqrt(s["a"]) + epsilon)


def np_lamb(
    w, g, s, t, lr, beta_1=0.9, beta_2=0.999, epsilon=1e-6, weight_decay=0.0, excluded=False
):
    s["m"] = beta_1 * s.get("m", 0.0) + (1 - beta_1) * g
    s["v"] = beta_2 * s.get("v", 0.0) + (1 - beta_2) * g * g
    r = (s["m"] / (1 - beta_1**t)) / (np.sqrt(s["v"] / (1 - beta_2**t)) + epsilon)
    if excluded:
        return w - lr * r
    r = r + weight_decay * w
    w_norm, r_norm = np.linalg.norm(w), np.linalg.norm(r)
    ratio = w_norm / r_norm if w_norm > 0 and r_norm > 0 else 1.0
    return w - lr * ratio * r


def np_lars(
    w,
    g,
    s,
    t,
    lr,
    momentum=0.9,
    weight_decay=0.0,
    eta=0.001,
    epsilon=0.0,
    nesterov=False,
    excluded=False,
):
    if excluded:
        scaled = lr * g
    else:
        w_norm, g_norm = np.linalg.norm(w), np.linalg.norm(g)
        local = 1.0
        if w_norm > 0 and g_norm > 0:
            local = eta * w_norm / (g_norm + weight_decay * w_norm + epsilon)
        scaled = lr * local * (g + weight_decay * w)
    s["m"] = momentum * s.get("m", 0.0) + scaled
    return w - (momentum * s["m"] + scaled if nesterov else s["m"])


# (name, towers optimizer, numpy rule, rule kwargs); LR schedules tested below.
CASES = {
    "sgd": (lambda: towers.SGD(0.1), np_sgd, dict(lr=0.1)),
    "momentum": (lambda: towers.SGD(0.1, 0.9), np_sgd, dict(lr=0.1, momentum=0.9)),
    "nesterov": (
        lambda: towers.SGD(0.1, 0.9, nesterov=True),
        np_sgd,
        dict(lr=0.1, momentum=0.9, nesterov=True),
    ),
    "adam": (lambda: towers.Adam(0.01), np_adam, dict(lr=0.01)),
    "adamw": (
        lambda: towers.AdamW(0.01, weight_decay=0.1, exclude=("b1",)),
        np_adamw,
        dict(lr=0.01, weight_decay=0.1),
    ),
    "rmsprop": (
        lambda: towers.RMSProp(0.01, momentum=0.5),
        np_rmsprop,
        dict(lr=0.01, momentum=0.5),
    ),
    "centered": (
        lambda: towers.RMSProp(0.01, centered=True),
        np_rmsprop,
        dict(lr=0.01, centered=True),
    ),
    "adagrad": (lambda: towers.Adagrad(0.1), np_adagrad, dict(lr=0.1)),
    "lamb": (
        lambda: towers.LAMB(0.01, weight_decay=0.01, exclude=("b1",)),
        np_lamb,
        dict(lr=0.01, weight_decay=0.01),
    ),
    "lars": (
        lambda: towers.LARS(1.0, weight_decay=0.01, exclude=("b1",)),
        np_lars,
        dict(lr=1.0, weight_decay=0.01),
    ),
}
EXCLUDABLE = ("adamw", "lamb", "lars")
STEPS = 5


def _numpy_run(case, steps=STEPS):
    """The model trained by hand: a tape on the whole batch, the numpy rule on the weights."""
    _, rule, kwargs = CASES[case]
    model = test_util.Model()
    model(test_util.batch(1)[0])
    weights = {v.name: v.numpy().astype(np.float64) for v in model.trainable_variables}
    states = {name: {} for name in weights}
    for step in range(steps):
        with tf.GradientTape() as tape:
            loss, _ = test_util.loss_fn(model)(test_util.batch(11, seed=step))
        grads = tape.gradient(loss, model.trainable_variables)
        for var, grad in zip(model.trainable_variables, grads):
            if grad is None:
                continue
            extra = {"excluded": var.name.startswith("b1")} if case in EXCLUDABLE else {}
            weights[var.name] = rule(
                weights[var.name],
                test_util.dense(grad),
                states[var.name],
                step + 1,
                **kwargs,
                **extra,
            )
            var.assign(weights[var.name].astype(np.float32))
    return model


class RuleTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.parameters(*CASES)
    def test_twenty_steps_equal_the_numpy_rule(self, case):
        make, rule, kwargs = CASES[case]
        rng = np.random.default_rng(0)
        start = rng.normal(size=(3, 4)).astype(np.float32)
        var = tf.Variable(start, name="kernel")
        optimizer = make()
        expected, state = start.astype(np.float64), {}
        for t in range(1, 21):
            grad = rng.normal(size=(3, 4)).astype(np.float32)
            optimizer.apply_gradients([(tf.constant(grad), var)])
            expected = rule(expected, grad.astype(np.float64), state, t, **kwargs)
        test_util.assert_allclose(var, expected, rtol=1e-5, atol=1e-6)

    @parameterized.parameters(*CASES)
    def test_sparse_rows_equal_their_dense_gradient(self, case):
        """Duplicate rows add up; rows without gradient change as the rule says."""
        make = CASES[case][0]
        dense_var, sparse_var = (
            tf.Variable(np.ones([5, 2], np.float32)),
            tf.Variable(np.ones([5, 2], np.float32)),
        )
        dense_opt, sparse_opt = make(), make()
        for _ in range(3):
            rows = tf.IndexedSlices(
                tf.constant([[1.0, 2.0], [0.5, -1.0], [3.0, 0.0]]),
                tf.constant([1, 3, 1]),
                tf.constant([5, 2]),
            )
            sparse_opt.apply_gradients([(rows, sparse_var)])
            dense_opt.apply_gradients([(tf.convert_to_tensor(rows), dense_var)])
        test_util.assert_allclose(sparse_var, dense_var, rtol=1e-6, atol=1e-7)


def twenty_steps(test: tf.test.TestCase, case: str, finite: bool | None, jit_compile: bool):
    """Twenty `apply_gradients` of rule `case` under the verdict `finite`: the numpy rule's
    weights (or, with False, the state as built), in one XLA program wherever the update is
    compiled (`jit_compile`, or a GPU: `towers.ops.internal.in_programs`), the choice inside
    it; uncompiled elsewhere, no program at all."""
    make, rule, kwargs = CASES[case]
    rng = np.random.default_rng(0)
    start = rng.normal(size=(3, 4)).astype(np.float32)
    var = tf.Variable(start, name="kernel")
    optimizer = make()

    @tf.function
    def apply(grad):
        verdict = None if finite is None else tf.constant(finite)
        optimizer.apply_gradients([(grad, var)], finite=verdict, jit_compile=jit_compile)

    expected, state = start.astype(np.float64), {}
    for t in range(1, 21):
        grad = rng.normal(size=(3, 4)).astype(np.float32)
        if finite is False and t == 2:  # the state as built, before any step
            built = [v.numpy() for v in optimizer.variables]
        apply(tf.constant(grad))
        if finite is not False:
            expected = rule(expected, grad.astype(np.float64), state, t, **kwargs)
    test_util.assert_allclose(var, expected, rtol=1e-5, atol=1e-6)
    if finite is False:
        for got, want in zip(optimizer.variables, built):
            test.assertAllEqual(got, want)
    graph = apply.get_concrete_function(tf.constant(grad)).graph
    programs = [
        op.node_def.attr["f"].func.name
        for op in graph.get_operations()
        if "_XlaMustCompile" in op.node_def.attr
    ]
    test.assertLen(programs, int(jit_compile or in_programs(var.device)))
    test.assertTrue(all("__inference_update_" in name for name in programs), programs)


class CompiledUpdateTest(tf.test.TestCase, parameterized.TestCase):
    """`apply_gradients(..., jit_compile=True)`: one XLA program, the numpy rule's result."""

    @parameterized.parameters(
        *((case, finite, True) for case in CASES for finite in (None, True, False)),
        *((case, False, False) for case in CASES),  # each rule's choice uncompiled too
    )
    def test_twenty_compiled_steps_equal_the_numpy_rule(self, case, finite, jit_compile):
        """And with the verdict False, nothing moves: weights, slots and step count. (Through
        `train_step`, with the error naming the variable: `nonfinite_test`.)"""
        twenty_steps(self, case, finite, jit_compile)

    @parameterized.parameters(*CASES)
    def test_compiled_sparse_rows_equal_the_uncompiled(self, case):
        """Sparse gradients (duplicate rows) and a schedule: as the uncompiled update."""
        make = CASES[case][0]
        plain_var, compiled_var = (tf.Variable(np.ones([5, 2], np.float32)) for _ in range(2))
        plain, compiled = make(), make()
        schedule = towers.schedules.CosineDecay(0.1, decay_steps=5)
        plain.learning_rate = compiled.learning_rate = schedule

        @tf.function
        def apply(rows):
            plain.apply_gradients([(rows, plain_var)])
            compiled.apply_gradients([(rows, compiled_var)], jit_compile=True)

        for i in range(3):
            apply(
                tf.IndexedSlices(
                    tf.constant([[1.0, 2.0], [0.5, -1.0], [3.0, float(i)]]),
                    tf.constant([1, 3, 1]),
                    tf.constant([5, 2]),
                )
            )
        test_util.assert_allclose(compiled_var, plain_var, rtol=1e-6, atol=1e-7)
        for got, want in zip(compiled.variables, plain.variables):
            test_util.assert_allclose(got, want, rtol=1e-6, atol=1e-7)

    def test_jit_compile_must_be_a_bool(self):
        var = tf.Variable([1.0])
        with self.assertRaisesRegex(TypeError, "`jit_compile` must be True or False; got 1"):
            towers.SGD(0.1).apply_gradients([(tf.constant([1.0]), var)], jit_compile=1)


class TowersTest(tf.test.TestCase, parameterized.TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.references = {case: _numpy_run(case) for case in ("momentum", "adam", "lamb")}

    # Every tower count (K=1 the identity; 11 examples uneven over 3, 4 and 8): momentum at
    # 1, 3 and 8, the stateful rules (two slots; norms per variable) at one uneven count each,
    # LAMB's the 4. Every rule in each strategy; each rule alone, compiled or not: the classes
    # above.
    @parameterized.parameters(
        *(("momentum", k, strategy) for k in (1, 3, 8) for strategy in ("ps", "replicated")),
        *(
            (case, k, strategy)
            for case, k in (("adam", 3), ("lamb", 4))
            for strategy in ("ps", "replicated")
        ),
    )
    def test_k_towers_equal_the_hand_written_step(self, case, k, strategy):
        self._check_k_towers(case, k, strategy)

    # Compiled towers and updates: each strategy, and each of the three rules once, on two
    # towers (11 examples: 6 and 5; the compiled programs are one per tower, K above).
    @parameterized.parameters(("momentum", "replicated"), ("adam", "ps"), ("lamb", "ps"))
    def test_compiled_towers_and_updates_equal_the_hand_written_step(self, case, strategy):
        self._check_k_towers(case, 2, strategy, jit_compile=True)

    def _check_k_towers(self, case, k, strategy, jit_compile=False):
        devices = test_util.devices(k)
        optimizer = CASES[case][0]()
        if strategy == "replicated":

            def build():
                model = test_util.Model()
                model(test_util.batch(1)[0])
                return model

            model = towers.Replicated(build, devices)
            local = model.local
        else:
            model = test_util.Model()
            local = lambda: model  # noqa: E731

        @tf.function
        def step(batch):
            return towers.train_step(
                lambda b: test_util.loss_fn(local())(b),
                model,
                optimizer,
                batch,
                devices,
                jit_compile=jit_compile,
            )

        for i in range(STEPS):
            step(test_util.batch(11, seed=i))
        trained = model.replicas[-1] if strategy == "replicated" else model
        for got, want in zip(trained.variables, self.references[case].variables):
            test_util.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        if strategy == "replicated":
            towers.check_replicas_identical(model)
            towers.check_replicas_identical(optimizer)

    # Two copies (11 examples: 6 and 5): the rule applies the all-reduced gradient whatever
    # the tower count, which test_k_towers_equal_the_hand_written_step varies.
    @parameterized.parameters(*(c for c in CASES if c not in ("momentum", "adam", "lamb")))
    def test_every_other_rule_on_two_replicated_towers(self, case):
        devices = test_util.devices(2)
        optimizer = CASES[case][0]()

        def build():
            model = test_util.Model()
            model(test_util.batch(1)[0])
            return model

        replicas = towers.Replicated(build, devices)

        @tf.function
        def step(batch):
            return towers.train_step(
                lambda b: test_util.loss_fn(replicas.local())(b),
                replicas,
                optimizer,
                batch,
                devices,
            )

        for i in range(STEPS):
            step(test_util.batch(11, seed=i))
        reference = _numpy_run(case)
        for got, want in zip(replicas.replicas[1].variables, reference.variables):
            test_util.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        towers.check_replicas_identical(replicas)
        towers.check_replicas_identical(optimizer)


if __name__ == "__main__":
    tf.test.main()
