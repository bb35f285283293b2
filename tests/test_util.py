"""Helpers shared by the tests: devices, a model, and hand-written single-device references.

Importing this module sets the process up as every test expects (so that each test file also
runs alone, e.g. `python -m tests.towers.step.train_step_test`): TensorFlow's INFO and WARNING logs
quieted (errors stay), and one CPU split into 8 logical devices.

Two tiers, chosen by the environment variable `TOWERS_TEST_KIND`:
- "CPU" (the default): the towers run on the logical CPUs; GPUs are hidden from this process
  and from every process it starts, so the suite runs alike on a machine with GPUs. Grappler's
  constant folding is off in this process (a sixth of the CPU time of the step tests, no
  change to what runs: the same kernels compute the same values, at run time), as in the worker
  programs that import this module; the GPU tier keeps TensorFlow's defaults, and so do the
  processes tests start that do not (the benchmark, the examples, the launcher's scripts).
  XLA compiles its CPU programs without LLVM's optimization passes (`XLA_FLAGS`), and each op
  runs on one thread (`TF_NUM_INTRAOP_THREADS=1`; the ops of a step still run side by side),
  both inherited by every process a test starts: the same programs, less CPU time.
- "GPU": the towers run on 8 logical GPUs split from the first GPU (`TOWERS_TEST_GPU_MB` MiB
  each, default 1024), beside the 8 logical CPUs; TensorFloat-32 is off (the suite asserts
  float32 exactness) and soft placement too, so an op without a GPU kernel placed on a GPU
  fails as it would in a v1 session. Processes the tests start still see no GPU.
"""

import contextlib
import os
import re
import subprocess
import sys
import tempfile

from tests import forked

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow loads
KIND = os.environ.get("TOWERS_TEST_KIND", "CPU").upper()
if KIND not in ("CPU", "GPU"):
    raise ValueError(f"TOWERS_TEST_KIND must be CPU or GPU; got {KIND!r}.")
if KIND == "CPU":
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # no GPU here nor in the processes tests start
    # XLA's CPU programs compiled without LLVM's optimization passes: the same HLO, a quarter
    # less CPU time in the compiled tests (BUILD.md); here and in the processes tests start.
    _XLA_FLAG = "--xla_backend_optimization_level=0"
    if _XLA_FLAG not in os.environ.get("XLA_FLAGS", "").split():
        os.environ["XLA_FLAGS"] = " ".join(filter(None, [os.environ.get("XLA_FLAGS"), _XLA_FLAG]))
    # One thread per op (TensorFlow's intra-op pool): on this 2-core machine two test processes
    # and the processes they start share the cores, and a pool of threads that spin while they
    # wait for work only burns them (a sixth of the CPU time of the step tests).
    os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository's
SITE = os.path.join(ROOT, "tests", "site")  # sitecustomize: Keras loads in a process that uses it
if SITE not in os.environ.get("PYTHONPATH", "").split(os.pathsep):  # for every process from here
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [SITE, os.environ.get("PYTHONPATH")]))

# What TensorFlow 2.21 logs while it loads and finds its devices, before its log level applies
# (absl writes everything to stderr until then): INFO lines, absl's notice of it, and the failed
# cuInit that hiding the GPU causes. Everything else it writes then still shows.
_START_NOISE = re.compile(
    r"^(I\d{4} |WARNING: All log messages before absl::InitializeLog"
    + (r"|E\d{4} .*failed call to cuInit" if KIND == "CPU" else "")
    + ")"
)


@contextlib.contextmanager
def _quiet_start():
    """Sends file descriptor 2 to a file while TensorFlow starts, then shows all but noise."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+") as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            sys.stderr.write("".join(line for line in caught if not _START_NOISE.match(line)))


with _quiet_start():
    import numpy as np
    import tensorflow as tf

    import towers

    NUM_DEVICES = int(os.environ.get("TOWERS_TEST_DEVICES", "8"))  # workers of a test: fewer
    tf.get_logger().setLevel("ERROR")
    towers.simulate_devices(NUM_DEVICES)
    if KIND == "CPU":  # Grappler's constant folding: a sixth of the step tests' CPU (BUILD.md)
        tf.config.optimizer.set_experimental_options({"constant_folding": False})
    if KIND == "GPU":
        tf.config.experimental.enable_tensor_float_32_execution(False)
        tf.config.set_soft_device_placement(False)
        megabytes = int(os.environ.get("TOWERS_TEST_GPU_MB", "1024"))
        towers.simulate_devices(NUM_DEVICES, "GPU", memory_limit_mb=megabytes)
        tf.config.list_logical_devices()  # CUDA starts now (the runtime, with its GPUs)
if KIND == "GPU":  # CUDA is initialized: for the processes tests start (each would take the
    os.environ.update(CUDA_VISIBLE_DEVICES="", TOWERS_TEST_KIND="CPU")  # whole GPU): CPU tier
VOCAB, FEATURES, EMBED, HIDDEN, CLASSES = 13, 6, 4, 8, 3


def devices(num: int) -> list[str]:
    """The first `num` logical devices of this tier (CPUs or GPUs), canonical names."""
    return [f"/device:{KIND}:{i}" for i in range(num)]


def reference_device() -> str:
    """Where the hand-written single-device references run: this tier's first device."""
    return devices(1)[0]


class Model(tf.Module):
    """Embedding + MLP with an unused variable: sparse, dense and None gradients in one model.

    Variables are created on the first call, so the first tower creates them.
    """

    def __init__(self, seed: int = 0):
        super().__init__(name="model")
        self.seed = seed
        self.built = False

    def _build(self):
        def init(shape, i):
            return tf.random.stateless_normal(shape, seed=[self.seed, i], stddev=0.5)

        self.embedding = tf.Variable(init([VOCAB, EMBED], 1), name="embedding")
        self.w1 = tf.Variable(init([FEATURES + EMBED, HIDDEN], 2), name="w1")
        self.b1 = tf.Variable(tf.zeros([HIDDEN]), name="b1")
        self.w2 = tf.Variable(init([HIDDEN, CLASSES], 3), name="w2")
        self.unused = tf.Variable(tf.ones([2]), name="unused")
        self.built = True

    def __call__(self, inputs):
        if not self.built:
            self._build()
        embedded = tf.reduce_mean(tf.gather(self.embedding, inputs["ids"]), axis=1)
        hidden = tf.tanh(tf.matmul(tf.concat([inputs["features"], embedded], 1), self.w1) + self.b1)
        return tf.matmul(hidden, self.w2)


def built_model() -> Model:
    """A `Model` whose variables exist (called once on a one-example batch)."""
    model = Model()
    model(batch(1)[0])
    return model


def loss_fn(model: Model):
    """The shard's mean cross-entropy, and the logits as outputs."""

    def fn(batch):
        inputs, labels = batch
        logits = model(inputs)
        loss = tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
        )
        return loss, logits

    return fn


def batch(size: int, seed: int = 0):
    """A deterministic nested batch: ((features, ids), labels)."""
    rng = np.random.default_rng(seed)
    inputs = {
        "features": tf.constant(rng.normal(size=(size, FEATURES)), tf.float32),
        "ids": tf.constant(rng.integers(0, VOCAB, size=(size, 2)), tf.int32),
    }
    return inputs, tf.constant(rng.integers(0, CLASSES, size=(size,)), tf.int32)


def dense(grad) -> np.ndarray | None:
    """A gradient as a dense numpy array (IndexedSlices summed into rows), None kept."""
    if grad is None:
        return None
    if isinstance(grad, tf.IndexedSlices):
        grad = tf.math.unsorted_segment_sum(grad.values, grad.indices, grad.dense_shape[0])
    return np.asarray(grad)


def reference_gradients(model: Model, full_batch) -> tuple[list, list]:
    """Gradients of the whole batch's mean loss on one device: (grads, variables)."""
    with tf.device(reference_device()):
        with tf.GradientTape() as tape:
            loss, _ = loss_fn(model)(full_batch)
        variables = list(model.trainable_variables)
        return tape.gradient(loss, variables), variables


def reference_step(
    model: tf.Module, loss_fn, learning_rate: float, momentum: float = 0.0, variables=None
):
    """A hand-written single-device SGD step: one tape on the whole batch, a plain update.

    No `towers` code is involved: this is what every equivalence test compares against.
    With momentum: `m = momentum * m + g; w -= learning_rate * m` (slots made on first use).

    Args:
      model: The model; its trainable variables are updated.
      loss_fn: `loss_fn(batch)` returns the batch's mean loss (or `(loss, outputs)`).
      learning_rate: The step size.
      momentum: The momentum coefficient; 0 for plain SGD.
      variables: The variables to train; default `model.trainable_variables`.

    Returns:
      A `tf.function` taking a batch and returning `(loss, outputs)` before the update.
    """
    slots = {}

    @tf.function
    def step(batch):
        with tf.device(reference_device()):
            with tf.GradientTape() as tape:
                result = loss_fn(batch)
            loss, outputs = result if isinstance(result, tuple) else (result, None)
            trained = model.trainable_variables if variables is None else variables
            for var, grad in zip(trained, tape.gradient(loss, trained)):
                if grad is None:
                    continue
                grad = tf.convert_to_tensor(grad)
                if momentum:
                    if var.ref() not in slots:
                        with tf.init_scope():
                            slots[var.ref()] = tf.Variable(
                                tf.zeros(var.shape, var.dtype), trainable=False
                            )
                    slot = slots[var.ref()]
                    slot.assign(momentum * slot + grad)
                    grad = slot.read_value()
                var.assign_sub(learning_rate * grad)
        return loss, outputs

    return step


def assert_allclose(actual, expected, rtol=1e-6, atol=1e-7):
    """Relative comparison with a small absolute floor for entries near zero."""
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), rtol=rtol, atol=atol)


def op_devices(graph: tf.Graph, pattern: str) -> dict[str, str]:
    """Requested device (canonical) of every op whose name contains `pattern`."""
    return {op.name: local_device(op.device) for op in graph.get_operations() if pattern in op.name}


def ancestors(op: tf.Operation) -> set[tf.Operation]:
    """Every op `op` waits for in its graph, through its inputs and control inputs."""
    seen, todo = set(), [op]
    while todo:
        current = todo.pop()
        for before in [t.op for t in current.inputs] + list(current.control_inputs):
            if before not in seen:
                seen.add(before)
                todo.append(before)
    return seen


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a process a test starts: this one's, the repository importable."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ["PYTHONPATH"]]), **extra}


def run_python(code: str, timeout: float = 120, fresh: bool = False) -> str:
    """Runs `code` in a process of its own with this project importable; returns its stdout.

    The process is forked from one that has imported TensorFlow and towers (`tests.forked`:
    seconds of CPU less), or, with `fresh`, a new interpreter (what a process finds or does
    as it starts).
    """
    env = child_env()
    done = (subprocess if fresh else forked).run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"child failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


def local_device(device: str) -> str:
    """A device name without job, replica and task, e.g. "/device:CPU:3"; "" stays ""."""
    if not device:
        return ""
    spec = tf.DeviceSpec.from_string(device)
    return spec.replace(job=None, replica=None, task=None).to_string()
