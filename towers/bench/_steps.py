"""The training steps the benchmark compares: one optimizer rule, the same model and data."""

import functools
from collections.abc import Callable

import tensorflow as tf

import towers
from towers.bench._models import MODELS, mean_loss

# Adam's is its customary default: at 0.01 it memorized the benchmark's one batch within 4
# steps, and a loss near 0 carries float32 round-off of ~1e-6 relative, which made the rows'
# losses (one check that every configuration trained the same model) differ by reduction order.
LEARNING_RATES = {"sgd": 0.01, "momentum": 0.01, "adam": 1e-3}
OPTIMIZERS = tuple(LEARNING_RATES)
Step = Callable[[tuple], tf.Tensor]


def towers_optimizer(name: str) -> towers.Optimizer:
    """The towers optimizer of the benchmark's rule `name`."""
    if name == "adam":
        return towers.Adam(LEARNING_RATES[name])
    return towers.SGD(LEARNING_RATES[name], momentum=0.9 if name == "momentum" else 0.0)


class HandUpdate:
    """The same rule written by hand, as a peer would: TensorFlow's fused kernels directly."""

    def __init__(self, name: str, variables: list[tf.Variable]):
        self.name, self.variables = name, list(variables)
        self.slots = {}
        if name != "sgd":
            for var in self.variables:
                with tf.device(var.device):
                    self.slots[var.ref()] = [
                        tf.Variable(tf.zeros_like(var), trainable=False)
                        for _ in range(2 if name == "adam" else 1)
                    ]
        with tf.device("/cpu:0"):
            self.steps = tf.Variable(0.0, trainable=False)

    def apply(self, grads: list) -> list[tf.Operation]:
        """One update of every variable with its gradient.

        Returns the update ops: a v1 graph runs them only as control inputs of what is fetched.
        """
        t = self.steps.assign_add(1.0)
        lr = tf.constant(LEARNING_RATES[self.name])
        ops = []
        for var, grad in zip(self.variables, grads):
            slots = self.slots.get(var.ref())
            if self.name == "sgd":
                op = tf.raw_ops.ResourceApplyGradientDescent(var=var.handle, alpha=lr, delta=grad)
            elif self.name == "momentum":
                op = tf.raw_ops.ResourceApplyMomentum(
                    var=var.handle, accum=slots[0].handle, lr=lr, grad=grad, momentum=0.9
                )
            else:
                op = tf.raw_ops.ResourceApplyAdam(
                    var=var.handle,
                    m=slots[0].handle,
                    v=slots[1].handle,
                    beta1_power=tf.pow(0.9, t),
                    beta2_power=tf.pow(0.999, t),
                    lr=lr,
                    beta1=0.9,
                    beta2=0.999,
                    epsilon=1e-7,
                    grad=grad,
                )
            ops.append(op)
        return ops


def one_device(model_name: str, devices: list[str], optimizer: str = "sgd") -> Step:
    """The whole batch on the first device: the floor on shared cores."""
    with tf.device(devices[0]):
        model = MODELS[model_name]()
        update = HandUpdate(optimizer, model.trainable_variables)

    def step(batch):
        with tf.device(devices[0]):
            with tf.GradientTape() as tape:
                loss = mean_loss(model, batch)
            grads = tape.gradient(loss, model.trainable_variables)
            with tf.control_dependencies(update.apply(grads)):
                return tf.identity(loss)

    return step


def hand_written(model_name: str, devices: list[str], optimizer: str = "sgd") -> Step:
    """The TF1 recipe by hand: split on the CPU, one tower per device, mean on the CPU."""
    with tf.device("/cpu:0"):
        model = MODELS[model_name]()
        update = HandUpdate(optimizer, model.trainable_variables)
    k = len(devices)

    def step(batch):
        with tf.device("/cpu:0"):
            xs, ys = tf.split(batch[0], k), tf.split(batch[1], k)
        tower_grads, losses = [], []
        for i, device in enumerate(devices):
            with tf.device(device), tf.name_scope(f"tower_{i}"):
                with tf.GradientTape() as tape:
                    loss = mean_loss(model, (xs[i], ys[i]))
                tower_grads.append(tape.gradient(loss, model.trainable_variables))
                losses.append(loss)
        with tf.device("/cpu:0"):
            updates = update.apply([tf.add_n(grads) / k for grads in zip(*tower_grads)])
            with tf.control_dependencies(updates):
                return tf.add_n(losses) / k

    return step


def towers_parameter_server(
    model_name: str, devices: list[str], optimizer: str = "sgd", packed: bool = True
) -> Step:
    """`towers.train_step` with the model's variables on the CPU (small gradients packed)."""
    with tf.device("/cpu:0"):
        model = MODELS[model_name]()
    optimizer = towers_optimizer(optimizer)
    loss_fn = functools.partial(mean_loss, model)
    strategy = (
        towers.ParameterServer("/cpu:0")
        if packed
        else towers.ParameterServer("/cpu:0", bucket_bytes=None)
    )

    def step(batch):  # a def like the peers' (AutoGraph parses a lambda's whole file)
        return towers.train_step(
            loss_fn, model, optimizer, batch, devices, variable_strategy=strategy
        )[0]

    return step


def towers_replicated(
    model_name: str,
    devices: list[str],
    algorithm: str | towers.ops.AllReduce,
    bucket_bytes: int | None = 64 * 2**20,
    optimizer: str = "sgd",
    sharded: bool = False,
) -> Step:
    """`towers.train_step` with `Replicated` variables and the given all-reduce.

    With `sharded`, the optimizer state is sharded (`shard_optimizer_state=True`). In a v1
    graph the copies are not broadcast: the models' initial values are the same (stateless,
    seeded) on every device.
    """
    replicas = towers.Replicated(
        MODELS[model_name],
        devices,
        all_reduce=algorithm,
        bucket_bytes=bucket_bytes,
        shard_optimizer_state=sharded,
    )
    optimizer = towers_optimizer(optimizer)

    def loss_fn(shard):
        return mean_loss(replicas.local(), shard)

    def step(batch):
        return towers.train_step(loss_fn, replicas, optimizer, batch, devices)[0]

    return step


def mirrored_replica_step(model_name: str, strategy: tf.distribute.Strategy) -> Step:
    """A `tf.distribute` replica's step by hand: its gradients all-reduced, plain SGD.

    The model is built in `strategy.scope()`; run the step with `strategy.run`.
    """
    with strategy.scope():
        model = MODELS[model_name]()

    def apply(distribution, grads):
        for var, grad in zip(model.trainable_variables, grads):
            distribution.extended.update(
                var, lambda v, g: v.assign_sub(LEARNING_RATES["sgd"] * g), args=(grad,)
            )

    def replica_step(shard):
        with tf.GradientTape() as tape:
            loss = mean_loss(model, shard)
        grads = tape.gradient(loss, model.trainable_variables)
        context = tf.distribute.get_replica_context()
        context.merge_call(apply, args=(context.all_reduce("mean", grads),))
        return loss

    return replica_step


def mirrored(model_name: str, devices: list[str], strategy: tf.distribute.Strategy) -> Step:
    """`tf.distribute.MirroredStrategy` in a custom loop: what a peer would write instead.

    One strategy serves every model of a process: two MirroredStrategy objects on the same
    devices reuse the same collective keys and their all-reduces collide.
    """
    replica_step = mirrored_replica_step(model_name, strategy)
    k = len(devices)

    @tf.function
    def step(batch):
        shards = (tf.split(batch[0], k), tf.split(batch[1], k))
        per_replica = strategy.experimental_distribute_values_from_function(
            lambda ctx: (
                shards[0][ctx.replica_id_in_sync_group],
                shards[1][ctx.replica_id_in_sync_group],
            )
        )
        losses = strategy.run(replica_step, args=(per_replica,))
        return strategy.reduce("mean", losses, axis=None)

    return step


def in_function(build: Callable[..., Step]) -> Callable[..., Step]:
    """The step `build` makes, as a `tf.function`."""
    return lambda model_name, devices: tf.function(build(model_name, devices))


def in_session(build: Callable[..., Step], data: tuple) -> Callable[..., Step]:
    """The step `build` makes, in a v1 graph run by a `Session`: the TF1 way.

    The batch is a constant of the graph (as the `tf.function` steps take one tensor), and
    the first call builds the graph, initializes it and runs it (its "trace" time).
    """

    def make(model_name: str, devices: list[str]) -> Step:
        made = []

        def step(batch):
            del batch  # the graph's own constant
            if not made:
                graph = tf.Graph()
                with graph.as_default():
                    loss = build(model_name, devices)(tuple(tf.constant(t) for t in data))
                    init = tf.compat.v1.global_variables_initializer()
                session = tf.compat.v1.Session(graph=graph, config=towers.session_config())
                session.run(init)
                made.append((session, loss))
            session, loss = made[0]
            return session.run(loss)

        return step

    return make


def step_bodies(
    algorithms: list[str], bucket_bytes: int | None = 64 * 2**20, optimizer: str = "sgd"
) -> dict[str, Callable[[str, list[str]], Step]]:
    """The steps that build in a `tf.function` and in a v1 graph alike, by row label."""
    bodies = {
        "one device": functools.partial(one_device, optimizer=optimizer),
        "hand-written towers": functools.partial(hand_written, optimizer=optimizer),
        "towers ps": functools.partial(towers_parameter_server, optimizer=optimizer),
        "towers ps unpacked": functools.partial(
            towers_parameter_server, optimizer=optimizer, packed=False
        ),
    }
    for algorithm in algorithms:
        bodies[f"towers replicated {algorithm}"] = functools.partial(
            towers_replicated, algorithm=algorithm, bucket_bytes=bucket_bytes, optimizer=optimizer
        )
    if algorithms and optimizer != "sgd":  # plain SGD keeps no state to shard
        first = f"towers replicated {algorithms[0]}"
        bodies[f"{first} sharded"] = functools.partial(bodies[first], sharded=True)
    return bodies


def configurations(
    algorithms: list[str],
    bucket_bytes: int | None = 64 * 2**20,
    strategy: tf.distribute.Strategy | None = None,
    optimizer: str = "sgd",
    data: tuple | None = None,
) -> dict[str, Callable[[str, list[str]], Step]]:
    """The steps to compare, by row label.

    MirroredStrategy's only with a `strategy` and plain SGD (its update is written inline).
    With `data` (numpy arrays), also the hand-written loop and towers in v1 sessions.
    """
    bodies = step_bodies(algorithms, bucket_bytes, optimizer)
    steps = {label: in_function(body) for label, body in bodies.items()}
    if strategy is not None and optimizer == "sgd":
        steps["mirrored strategy"] = functools.partial(mirrored, strategy=strategy)
    if data is not None:
        for label, body in bodies.items():
            if label != "one device":
                steps[f"{label} (v1 session)"] = in_session(body, data)
    return steps
