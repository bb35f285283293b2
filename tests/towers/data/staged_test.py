"""Input staged on the devices: the same training as the batches given, one batch ahead."""

import os
import re
from unittest import mock

import numpy as np
import tensorflow as tf
from absl.testing import parameterized

import towers
from tests import test_util
from towers.data import _staged, _transfer

BATCH, BATCHES = 11, 4


def _dataset(shuffled=False):
    inputs, labels = test_util.batch(BATCH * BATCHES)
    dataset = tf.data.Dataset.from_tensor_slices((inputs, labels))
    if shuffled:
        dataset = dataset.shuffle(20, seed=3)
    return dataset.batch(BATCH)


def _step(model, optimizer, devices, jit_compile=False):
    @tf.function
    def step(batch):
        return towers.train_step(
            test_util.loss_fn(model), model, optimizer, batch, devices, jit_compile=jit_compile
        )[0]

    return step


class _Net(tf.Module):
    def __init__(self):
        super().__init__()
        self.w = tf.Variable(tf.ones([8, 8]) / 8, name="w")


def _tanh_net(devices):
    """`Replicated` copies of one 8x8 weight, and a loss of a `_numbered` batch."""
    model = towers.Replicated(_Net, devices)

    def loss_fn(batch):
        return tf.reduce_mean(tf.square(tf.tanh(batch[0] @ model.local().w) - 1.0))

    return model, loss_fn


def _numbered(count, nan_every=0):
    """Batches of 16: features i / 100 (NaN in every `nan_every`-th, from the third), and i."""

    def batch(i):
        x = tf.fill([16, 8], tf.cast(i, tf.float32) / 100.0)
        if nan_every:
            x = tf.where(tf.equal(i % nan_every, nan_every - 1), np.nan, x)
        return x, tf.fill([16], i)

    return tf.data.Dataset.range(count).map(batch)


class StagedInputTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.parameters(False, True)
    def test_trains_like_one_device_on_the_same_batches(self, jit_compile):
        devices = test_util.devices(3)
        reference = test_util.built_model()
        by_hand = test_util.reference_step(reference, test_util.loss_fn(reference), 0.1)
        model = test_util.built_model()
        step = _step(model, towers.SGD(0.1), devices, jit_compile)
        staged = towers.prefetch_to_devices(_dataset(), devices)
        losses = [float(step(batch)) for batch in staged]  # ends with the data
        want = [float(by_hand(batch)[0]) for batch in _dataset()]
        test_util.assert_allclose(losses, want, rtol=1e-5)
        for got, expected in zip(model.variables, reference.variables):
            test_util.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
        self.assertEqual(step.experimental_get_tracing_count(), 1)
        with self.assertRaises(tf.errors.InvalidArgumentError):  # (its Assert's error)
            step(staged)

    def test_a_shard_for_a_gpu_leaves_the_host_as_a_fresh_tensor(self):
        """Each shard bound for a GPU is first copied on the host (`DeepCopy`, whose output
        TensorFlow allocates pinned: the transfer is then a DMA, not the driver's pageable
        copy); one for a CPU device, another task's GPU, or split on a GPU, goes as it is."""
        gpu = "/job:localhost/replica:0/task:0/device:GPU:1"  # (a buffer's device)
        with tf.Graph().as_default():
            for dtype in (tf.float32, tf.bfloat16, tf.uint8, tf.int64, tf.bool):
                leaf = tf.zeros([4, 2], dtype)
                sent = _transfer.sent(leaf, "/device:CPU:0", gpu)
                self.assertEqual(sent.op.type, "DeepCopy")
                self.assertEqual(test_util.local_device(sent.device), "/device:CPU:0")
            self.assertIs(_transfer.sent(leaf, "/device:CPU:0", "/device:CPU:1"), leaf)
            self.assertIs(_transfer.sent(leaf, "/device:GPU:0", gpu), leaf)
            for typeless in (None, "", "/job:localhost"):  # (StagedInput's own split_device)
                self.assertIs(_transfer.sent(leaf, typeless, gpu), leaf)
            host = "/job:localhost/replica:0/task:0/device:CPU:0"
            self.assertEqual(_transfer.sent(leaf, host, gpu).op.type, "DeepCopy")
            for remote in ("/job:worker/task:0/device:GPU:0", "/job:localhost/task:1/device:GPU:0"):
                self.assertIs(_transfer.sent(leaf, host, remote), leaf)  # (over the network)
            strings = tf.constant([["a"]] * 4)  # (a dtype outside the copy's list)
            self.assertIs(_transfer.sent(strings, "/device:CPU:0", gpu), strings)

    def test_trains_the_same_with_each_shard_copied_on_the_host(self):
        """Every device taken for a GPU: the fresh copies train as the batches given."""
        devices = test_util.devices(2)
        reference = test_util.built_model()
        by_hand = test_util.reference_step(reference, test_util.loss_fn(reference), 0.1)
        model = test_util.built_model()
        step = _step(model, towers.SGD(0.1), devices)
        copies, real = [], tf.raw_ops.DeepCopy

        def deep_copy(x):
            copies.append(x)
            return real(x=x)

        with (
            mock.patch.object(_transfer, "_host_to_gpu", lambda source, device: True),
            mock.patch.object(_transfer.tf.raw_ops, "DeepCopy", deep_copy),
        ):
            staged = towers.prefetch_to_devices(_dataset(), devices)  # (one batch staged now)
            shards = len(staged._specs) * len(devices)
            self.assertLen(copies, shards)  # eagerly
            arrays = staged.staged_arrays()
            staged.restore_staged(arrays)  # (a checkpoint's batch: eagerly again)
            self.assertLen(copies, 2 * shards)
            for key, array in staged.staged_arrays().items():
                np.testing.assert_array_equal(array, arrays[key])
            losses = [float(step(batch)) for batch in staged]
        self.assertLen(copies, 3 * shards)  # and once in the step's graph
        want = [float(by_hand(batch)[0]) for batch in _dataset()]
        test_util.assert_allclose(losses, want, rtol=1e-5)
        for got, expected in zip(model.variables, reference.variables):
            test_util.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)

    @parameterized.parameters(("ps", False), ("ps", True), ("replicated", True))
    def test_a_batch_smaller_than_the_devices_ends_the_input_and_loses_none(
        self, strategy, jit_compile
    ):
        """10 examples in batches of 4 on 3 devices: 4 and 4 trained, then the input ends.

        Before: staging the last batch (2 examples) failed the step that staged it, and
        that step's own full batch was lost (its update never landed).
        """
        devices = test_util.devices(3)
        inputs, labels = test_util.batch(10)
        dataset = tf.data.Dataset.from_tensor_slices((inputs, labels)).batch(4)  # 4, 4, 2
        reference = test_util.built_model()
        by_hand = test_util.reference_step(reference, test_util.loss_fn(reference), 0.1)
        for batch in list(dataset)[:2]:
            by_hand(batch)
        if strategy == "replicated":
            model = towers.Replicated(test_util.built_model, devices)
            trained, loss_fn = model.replicas[0], lambda b: test_util.loss_fn(model.local())(b)
        else:
            model = trained = test_util.built_model()
            loss_fn = test_util.loss_fn(model)

        @tf.function
        def step(batch):
            return towers.train_step(
                loss_fn, model, towers.SGD(0.1), batch, devices, jit_compile=jit_compile
            )[0]

        staged = towers.prefetch_to_devices(dataset, devices)
        self.assertLen([float(step(batch)) for batch in staged], 2)
        for got, expected in zip(trained.variables, reference.variables):
            test_util.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "prefetch_to_devices"):
            step(staged)  # one more: the staging's own error, and no change
        for got, expected in zip(trained.variables, reference.variables):
            test_util.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)

    def test_a_dtype_the_device_holds_no_variable_of_waits_on_its_host(self):
        """As int32 on a GPU (asked of the kernel registry; here it says so of every device):
        the ids and labels wait on CPU:0 and each step reads them onto the tower's device."""
        devices = test_util.devices(3)[-2:]  # not CPU:0, where the host's variables go
        no_int32 = lambda op, device, **dtypes: dtypes.get("dtype") != tf.int32  # noqa: E731
        with mock.patch.object(_staged, "has_kernel", no_int32):
            staged = towers.prefetch_to_devices(_dataset(), devices)
        kept = {spec.dtype: [] for spec in staged._specs}
        for buffers in staged._buffers:
            for buffer, spec in zip(buffers, staged._specs):
                kept[spec.dtype].append(test_util.local_device(buffer.device))
        self.assertEqual(kept[tf.int32], ["/device:CPU:0"] * 4)  # ids and labels, 2 devices
        self.assertEqual(kept[tf.float32], devices)
        shards, _ = staged.take()
        for shard, device in zip(shards, devices):
            for leaf in tf.nest.flatten(shard):
                self.assertEqual(test_util.local_device(leaf.device), device)
        reference = test_util.built_model()
        by_hand = test_util.reference_step(reference, test_util.loss_fn(reference), 0.1)
        model = test_util.built_model()
        step = _step(model, towers.SGD(0.1), devices)
        losses = [float(step(batch)) for batch in staged]
        want = [float(by_hand(batch)[0]) for batch in _dataset().skip(1)]  # (one was taken)
        test_util.assert_allclose(losses, want, rtol=1e-5)

    def test_shards_wait_on_their_devices_and_no_tower_waits_for_the_next(self):
        devices = test_util.devices(2)
        staged = towers.prefetch_to_devices(_dataset(), devices)
        shards, sizes = staged.take()
        self.assertEqual(sizes, [6, 5])
        for shard, device in zip(shards, devices):
            for leaf in tf.nest.flatten(shard):
                self.assertEqual(test_util.local_device(leaf.device), device)
        model = test_util.built_model()
        graph = _step(model, towers.SGD(0.1), devices).get_concrete_function(staged).graph
        (staging,) = [op for op in graph.get_operations() if op.type in ("If", "StatelessIf")]
        for op in graph.get_operations():
            if "tower_" in op.name and op.type == "MatMul":
                self.assertNotIn(staging, test_util.ancestors(op), op.name)
        reads = [op for op in graph.get_operations() if op.type == "ReadVariableOp"]
        self.assertTrue(any(test_util.local_device(op.device) == devices[1] for op in reads))

    @parameterized.parameters(False, True)
    def test_a_failing_raise_step_stages_the_next_batch_and_loses_none(self, jit_compile):
        """ "raise"'s check waits for the staging of the next batch: each failing call's
        batch is consumed and the next one staged whole, so the calls after it see the
        batches in order. Before (wave 5, session 35's review) the failing check could cut
        the staging, in about a quarter of failing calls on CPU devices: the failing batch
        staged again, the next one lost, or the iterator cancelled for good."""
        devices = test_util.devices(2)
        model, loss_fn = _tanh_net(devices)

        @tf.function
        def step(staged):
            return towers.train_step(
                loss_fn, model, towers.SGD(0.1), staged, devices, jit_compile=jit_compile
            )[0]

        staged = towers.prefetch_to_devices(_numbered(30, nan_every=3), devices)
        graph = step.get_concrete_function(staged).graph
        (staging,) = [op for op in graph.get_operations() if op.type in ("If", "StatelessIf")]
        (check,) = [
            op
            for op in graph.get_operations()
            if op.type == "Assert" and any(b"towers: a NaN" in t.op.get_attr("value").string_val[0]
                for t in op.inputs if t.op.type == "Const" and t.dtype == tf.string)
        ]  # fmt: skip
        self.assertIn(staging, test_util.ancestors(check))
        self._assert_in_order(step, staged, 29, lambda i: i % 3 == 2, "NaN or Inf")

    def test_a_failing_accumulated_mean_stages_the_next_batch_and_loses_none(self):
        """With `accumulate`, the mean's own check (here a learning rate gone NaN: each
        call's gradients are finite) waits for the staging too. Before (session 35's third
        review), 9 of 20 such failing calls left the input off by a batch or more."""
        devices = test_util.devices(2)
        model, loss_fn = _tanh_net(devices)
        rate = tf.Variable(0.1)
        optimizer, every = towers.SGD(rate), towers.GradientAccumulator(every=1)

        @tf.function
        def step(staged):
            return towers.train_step(loss_fn, model, optimizer, staged, devices, accumulate=every)

        def failing(i):  # (the rate NaN on every other call)
            rate.assign(np.nan if i % 2 else 0.1)
            return i % 2 == 1

        staged = towers.prefetch_to_devices(_numbered(40), devices)
        self._assert_in_order(step, staged, 30, failing, "learning rate")

    def _assert_in_order(self, step, staged, calls, failing, message):
        """`calls` calls of `step`, those `failing(i)` names raising `message`; after each,
        the batch after it is staged (`_numbered`'s second leaf says which)."""
        for i in range(calls):
            if failing(i):
                with self.assertRaisesRegex(tf.errors.InvalidArgumentError, message):
                    step(staged)
            else:
                step(staged)
            self.assertEqual(staged.staged_arrays()["1"][0], i + 1, i)

    def test_resumes_exactly_with_another_number_of_towers(self):
        directory = os.path.join(self.get_temp_dir(), "run")
        whole = test_util.built_model()
        step = _step(whole, towers.SGD(0.1), test_util.devices(2))
        for batch in towers.prefetch_to_devices(_dataset(shuffled=True), test_util.devices(2)):
            step(batch)

        first = test_util.built_model()
        staged = towers.prefetch_to_devices(_dataset(shuffled=True), test_util.devices(2))
        step = _step(first, towers.SGD(0.1), test_util.devices(2))
        with towers.CheckpointManager(directory, first, extra={"input": staged}) as manager:
            step(next(staged))
            step(next(staged))
            manager.save(2)
        resumed = test_util.built_model()
        staged = towers.prefetch_to_devices(_dataset(shuffled=True), test_util.devices(3))
        with towers.CheckpointManager(directory, resumed, extra={"input": staged}) as manager:
            self.assertEqual(manager.restore_latest(), 2)
        step = _step(resumed, towers.SGD(0.1), test_util.devices(3))
        self.assertLen([step(batch) for batch in staged], BATCHES - 2)
        for got, want in zip(resumed.variables, whole.variables):
            test_util.assert_allclose(got, want, rtol=1e-6, atol=1e-7)

    def test_a_staged_batch_that_does_not_fit_is_refused_and_nothing_changes(self):
        directory = os.path.join(self.get_temp_dir(), "run")
        model = test_util.built_model()
        staged = towers.prefetch_to_devices(_dataset(), test_util.devices(2))
        with towers.CheckpointManager(directory, model, extra={"input": staged}) as manager:
            manager.save(1)
        other = tf.data.Dataset.from_tensor_slices(np.ones([8, 3], np.float32)).batch(4)
        staged = towers.prefetch_to_devices(other, test_util.devices(2))
        with towers.CheckpointManager(directory, model, extra={"input": staged}) as manager:
            with self.assertRaisesRegex(ValueError, "resume with the dataset the run was saved"):
                manager.restore_latest()
        np.testing.assert_array_equal(staged.take()[0][0], np.ones([2, 3]))

    def test_bad_inputs(self):
        devices = test_util.devices(2)
        with self.assertRaisesRegex(TypeError, "must be a tf.data.Dataset; got list"):
            towers.prefetch_to_devices([1, 2], devices)
        ragged = tf.data.Dataset.from_tensors(tf.ragged.constant([[1], [2, 3]]))
        with self.assertRaisesRegex(TypeError, "stages dense tensors; leaf 0 .*RaggedTensorSpec"):
            towers.prefetch_to_devices(ragged, devices)
        with self.assertRaisesRegex(ValueError, "leaf 0 is a scalar"):
            towers.prefetch_to_devices(tf.data.Dataset.range(3), devices)
        with self.assertRaisesRegex(ValueError, "does not exist"):
            towers.prefetch_to_devices(_dataset(), ["/cpu:0", "/cpu:99"])
        small = tf.data.Dataset.from_tensor_slices(np.zeros([6, 2])).batch(1, drop_remainder=True)
        with self.assertRaisesRegex(ValueError, "batches hold 1 examples, fewer than the 2"):
            towers.prefetch_to_devices(small, devices)
        staged = towers.prefetch_to_devices(_dataset(), devices)
        model = test_util.built_model()
        with self.assertRaisesRegex(ValueError, re.escape(f"staged on {devices}")):
            _step(model, towers.SGD(0.1), test_util.devices(3))(staged)

        @tf.function
        def inside():
            return towers.prefetch_to_devices(_dataset(), devices)

        with self.assertRaisesRegex(ValueError, "made eagerly"):
            inside()


if __name__ == "__main__":
    tf.test.main()
