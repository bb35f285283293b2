"""Every op a step puts on a GPU has a GPU kernel for its dtypes: checked on any machine.

Soft placement is off in v1 sessions (and in the GPU tier): an op pinned to a GPU without a
kernel for it fails when the step first runs. A v1 graph can name GPUs that this machine lacks
(only a session checks devices), and TensorFlow's CPU build registers the GPU kernels too, so
whole steps are built here on four "GPUs" and each op, in the graph and in its functions, is
looked up in the kernel registry.
"""

import tensorflow as tf
from absl.testing import parameterized

import towers
from tests import test_util
from towers import ops
from towers.ops.internal import has_kernel

GPUS = [f"/device:GPU:{i}" for i in range(4)]
OPTIMIZERS = {
    "sgd": lambda: towers.SGD(0.1),
    "momentum": lambda: towers.SGD(0.1, 0.9, nesterov=True),
    "adam": lambda: towers.Adam(0.01),
    "adamw": lambda: towers.AdamW(0.01, exclude_rank_below=2),
    "rmsprop": lambda: towers.RMSProp(0.01, momentum=0.5, centered=True),
    "adagrad": lambda: towers.Adagrad(0.1),
    "lamb": lambda: towers.LAMB(0.01),
    "lars": lambda: towers.LARS(1.0),
}


def _nodes(graph: tf.Graph):
    """Every NodeDef of the graph and of the functions it holds (cond branches, ...)."""
    graph_def = graph.as_graph_def()
    yield from graph_def.node
    for function in graph_def.library.function:
        yield from function.node_def


def _missing_gpu_kernels(graph: tf.Graph) -> list[str]:
    missing = []
    for node in _nodes(graph):
        if "GPU" not in node.device:
            continue
        dtypes = {name: tf.as_dtype(a.type) for name, a in node.attr.items() if a.type}
        if not has_kernel(node.op, node.device, **dtypes):
            found = ", ".join(f"{k}={v.name}" for k, v in sorted(dtypes.items()))
            missing.append(f"{node.name} ({node.op}, {found}) on {node.device}")
    return missing


class Bfloat16Model(tf.Module):
    """bfloat16 variables: a GPU has no fused update kernel for them."""

    def __init__(self):
        super().__init__()
        self.w = tf.Variable(tf.ones([6, 3], tf.bfloat16), name="w")

    def __call__(self, inputs):
        return tf.cast(tf.matmul(tf.cast(inputs["features"], tf.bfloat16), self.w), tf.float32)


def _built(cls):
    def build():
        model = cls()
        model(test_util.batch(1)[0])
        return model

    return build


class GpuKernelsTest(tf.test.TestCase, parameterized.TestCase):
    def _assert_every_op_runs_on_its_gpu(self, graph: tf.Graph):
        self.assertTrue(any("GPU" in node.device for node in _nodes(graph)))
        self.assertEqual(_missing_gpu_kernels(graph), [])

    @parameterized.parameters(
        *((optimizer, "ring") for optimizer in ("sgd", "adam", "rmsprop", "adagrad", "lamb")),
        *(
            ("momentum", strategy)
            for strategy in ("ps_cpu", "ps_gpus", "reduce_broadcast", "collective", "hierarchical")
        ),
    )
    def test_train_step(self, optimizer, strategy):
        with tf.Graph().as_default() as graph:
            if strategy.startswith("ps"):
                model = test_util.Model()
                variable_strategy = towers.ParameterServer(
                    GPUS if strategy == "ps_gpus" else "/cpu:0"
                )
                local = lambda: model  # noqa: E731
            else:
                model = towers.Replicated(_built(test_util.Model), GPUS, all_reduce=strategy)
                variable_strategy, local = None, model.local
            towers.train_step(
                lambda b: test_util.loss_fn(local())(b),
                model,
                OPTIMIZERS[optimizer](),
                test_util.batch(11),
                GPUS,
                variable_strategy=variable_strategy,
                gradient_hook=lambda grads, _: [
                    None if g is None else tf.clip_by_norm(tf.convert_to_tensor(g), 1.0)
                    for g in grads
                ],
            )
        self._assert_every_op_runs_on_its_gpu(graph)

    @parameterized.parameters("sgd", "momentum", "adagrad", "rmsprop")
    def test_bfloat16_variables(self, optimizer):
        with tf.Graph().as_default() as graph:
            replicas = towers.Replicated(_built(Bfloat16Model), GPUS)
            towers.train_step(
                lambda b: tf.reduce_mean(replicas.local()(b[0]) ** 2),
                replicas,
                OPTIMIZERS[optimizer](),
                test_util.batch(8),
                GPUS,
            )
        self._assert_every_op_runs_on_its_gpu(graph)

    def test_loss_scale_accumulation_micro_batches_batch_norm_and_dropout(self):
        with tf.Graph().as_default() as graph:

            class Net(tf.Module):
                def __init__(self):
                    super().__init__()
                    self.w = tf.Variable(tf.ones([6, 4]), name="w")
                    self.bn = towers.BatchNorm(sync=True)
                    self.bn(tf.zeros([2, 4]), training=False)

                def __call__(self, x):
                    h = towers.dropout(self.bn(x @ self.w, training=True), 0.2, seed=[1, 2])
                    return tf.reduce_sum(h, axis=1)

            replicas = towers.Replicated(Net, GPUS)
            towers.train_step(
                lambda b: tf.reduce_mean(replicas.local()(b[0]["features"]) ** 2),
                replicas,
                towers.Adam(0.01),
                test_util.batch(16),
                GPUS,
                loss_scale=towers.DynamicLossScale(),
                micro_batches=2,
                accumulate=towers.GradientAccumulator(every=2),
            )
        self._assert_every_op_runs_on_its_gpu(graph)

    @parameterized.parameters("reduce_broadcast", "ring", "collective", "hierarchical")
    def test_integer_all_reduce(self, algorithm):
        with tf.Graph().as_default() as graph:
            values = []
            for device in GPUS:
                with tf.device(device):
                    values.append(tf.range(10, dtype=tf.int64))
            ops.all_reduce_algorithm(algorithm)(values, GPUS)
        self._assert_every_op_runs_on_its_gpu(graph)

    @parameterized.parameters("reduce_broadcast", "ring", "collective")
    def test_integer_reduce_scatter_and_all_gather(self, algorithm):
        with tf.Graph().as_default() as graph:
            values = []
            for device in GPUS:
                with tf.device(device):
                    values.append(tf.reshape(tf.range(10, dtype=tf.int64), [10, 1]))
            halves = ops.all_reduce_algorithm(algorithm)
            halves.all_gather(halves.reduce_scatter(values, GPUS), GPUS)
        self._assert_every_op_runs_on_its_gpu(graph)

    def test_sharded_optimizer_state(self):
        with tf.Graph().as_default() as graph:
            replicas = towers.Replicated(_built(test_util.Model), GPUS, shard_optimizer_state=True)
            towers.train_step(
                lambda b: test_util.loss_fn(replicas.local())(b),
                replicas,
                towers.Adam(0.01),
                test_util.batch(11),
                GPUS,
                nonfinite="skip",
            )
        self._assert_every_op_runs_on_its_gpu(graph)

    def test_the_cifar10_port_in_float64(self):
        """The GPU tier compares the port in float64 (examples/port_cifar10_multi_gpu.py)."""
        from examples import port_cifar10_multi_gpu as cifar  # noqa: PLC0415

        for stages in (False, True):
            graph = cifar.build_graph(GPUS, 0.1, 0, stages, tf.float64).graph
            self._assert_every_op_runs_on_its_gpu(graph)


if __name__ == "__main__":
    tf.test.main()
