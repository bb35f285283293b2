import os
import random
import signal
import sys
import time
import zipfile

import numpy as np
import tensorflow as tf
from absl.testing import parameterized

import towers
from tests import forked, test_util
from tests.towers.weights import golden
from towers import ops

FORMATS = ("w.npz", "w.h5", "ckpt")


def _built_model(seed=0):
    model = test_util.Model(seed)
    model(test_util.batch(1)[0])
    return model


def _snapshot(model):
    return {n: v.numpy().copy() for n, v in towers.named_variables(model).items()}


class SaveRestoreTest(tf.test.TestCase, parameterized.TestCase):
    @parameterized.parameters(*FORMATS)
    def test_round_trip(self, name):
        path = os.path.join(self.get_temp_dir(), name)
        saved, loaded = _built_model(0), _built_model(7)
        towers.save_weights(saved, path)
        report = towers.restore_weights(loaded, path)
        self.assertTrue(report.complete)
        self.assertEqual(report.restored, ("b1", "embedding", "unused", "w1", "w2"))
        for got, want in zip(loaded.variables, saved.variables):
            self.assertAllEqual(got, want)

    def test_checkpoint_is_readable_by_tensorflow(self):
        path = os.path.join(self.get_temp_dir(), "ckpt")
        model = _built_model()
        towers.save_weights(model, path)
        self.assertAllEqual(tf.train.load_checkpoint(path).get_tensor("w1"), model.w1)
        self.assertEqual(
            sorted(n for n, _ in tf.train.list_variables(path)),
            ["b1", "embedding", "unused", "w1", "w2"],
        )
        towers.save_weights(model, path)  # the replaced checkpoint's files are gone
        self.assertLen([n for n in os.listdir(path) if n.endswith(".index")], 1)

    def test_files_get_ordinary_permissions(self):
        path = os.path.join(self.get_temp_dir(), "w.npz")
        towers.save_weights(_built_model(), path)
        umask = os.umask(0)
        os.umask(umask)
        self.assertEqual(os.stat(path).st_mode & 0o777, 0o666 & ~umask)

    @parameterized.parameters(*FORMATS)
    def test_k_towers_to_one_device_and_back(self, name):
        """Trained with 4 towers, loaded by a plain program, and back: identical outputs."""
        path = os.path.join(self.get_temp_dir(), name)
        model = test_util.Model()
        devices = test_util.devices(4)
        step = tf.function(
            lambda b: towers.train_step(
                test_util.loss_fn(model), model, towers.SGD(0.1), b, devices
            )
        )
        for i in range(3):
            step(test_util.batch(12, seed=i))
        towers.save_weights(model, path)

        single = _built_model(seed=9)  # built outside any tower, on one device
        towers.restore_weights(single, path)
        inputs = test_util.batch(12, seed=99)[0]
        with tf.device("/cpu:0"):
            self.assertAllEqual(single(inputs), model(inputs))

        towers.save_weights(single, path)
        back = test_util.Model(seed=3)
        shards = ops.split_batch(inputs, 4)
        towers.replicate(back, shards, devices)  # builds the variables in tower 0
        towers.restore_weights(back, path)
        merged = ops.merge_outputs(towers.replicate(back, shards, devices), "concat")
        self.assertAllClose(merged, single(inputs), rtol=1e-6, atol=1e-6)

    def test_list_and_dict_targets(self):
        path = os.path.join(self.get_temp_dir(), "w.npz")
        with tf.name_scope("tower_3"):
            in_tower = tf.Variable([1.0, 2.0], name="dense/kernel")
        towers.save_weights([in_tower], path)
        self.assertEqual(list(towers.read_weights(path)), ["dense/kernel"])
        target = tf.Variable([0.0, 0.0])
        towers.restore_weights({"dense/kernel": target}, path)
        self.assertAllEqual(target, [1.0, 2.0])

    def test_bfloat16_needs_a_checkpoint(self):
        var = tf.Variable(tf.ones([2], tf.bfloat16), name="half")
        with self.assertRaisesRegex(TypeError, "'half' is bfloat16.*TensorFlow checkpoint"):
            towers.save_weights([var], os.path.join(self.get_temp_dir(), "w.npz"))
        path = os.path.join(self.get_temp_dir(), "ckpt")
        towers.save_weights([var], path)
        var.assign(tf.zeros([2], tf.bfloat16))
        towers.restore_weights([var], path)
        self.assertAllEqual(tf.cast(var, tf.float32), [1.0, 1.0])

    def test_v1_session(self):
        path = os.path.join(self.get_temp_dir(), "w.npz")
        with tf.Graph().as_default():
            model = test_util.Model()
            model(test_util.batch(1)[0])
            with tf.compat.v1.Session() as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                towers.save_weights(model, path, session=sess)
                sess.run(model.w1.assign(tf.zeros_like(model.w1)))
                ops_before = len(sess.graph.get_operations())
                towers.restore_weights(model, path, session=sess)
                self.assertEqual(len(sess.graph.get_operations()), ops_before)
                restored = sess.run(model.w1)
            with self.assertRaisesRegex(ValueError, "pass the session"):
                towers.save_weights(model, path)
            with self.assertRaisesRegex(ValueError, "only add ops that nothing runs"):
                towers.restore_weights(model, path)  # silently nothing, before
        self.assertAllEqual(restored, towers.read_weights(path)["w1"])

    def test_golden_file_keeps_loading(self):
        expected = golden.values()
        variables = {n: tf.Variable(tf.zeros(v.shape, v.dtype)) for n, v in expected.items()}
        self.assertTrue(towers.restore_weights(variables, golden.PATH).complete)
        for name, value in expected.items():
            self.assertAllEqual(variables[name], value)
            self.assertEqual(variables[name].dtype.as_numpy_dtype, value.dtype)


class StrictnessTest(tf.test.TestCase):
    def _file(self):
        path = os.path.join(self.get_temp_dir(), "w.npz")
        towers.save_weights(
            {
                "a": tf.Variable(np.ones([2, 3], np.float32)),
                "b": tf.Variable(np.ones([4], np.float32)),
                "c": tf.Variable(np.ones([1], np.int32)),
                "extra": tf.Variable(1.0),
            },
            path,
        )
        return path

    def _target(self):
        return {
            "a": tf.Variable(np.zeros([3, 2], np.float32)),
            "b": tf.Variable(np.zeros([4], np.float32)),
            "c": tf.Variable(np.zeros([1], np.float32)),
            "absent": tf.Variable(0.0),
        }

    def test_one_error_lists_every_problem_and_nothing_is_assigned(self):
        target = self._target()
        with self.assertRaisesRegex(
            ValueError,
            (
                r"(?s)nothing was restored.*missing from the file: absent.*unexpected in the file: "
                r"extra.*mismatch: a: file float32\[2, 3\], variable float32\[3, 2\].*"
                r"c: file int32\[1\], variable float32\[1\].*strict=False"
            ),
        ):
            towers.restore_weights(target, self._file())
        self.assertAllEqual(target["b"], np.zeros([4]))

    def test_non_strict_loads_what_matches(self):
        target = self._target()
        report = towers.restore_weights(target, self._file(), strict=False)
        self.assertEqual(report.restored, ("b",))
        self.assertEqual(report.missing, ("absent",))
        self.assertEqual(report.unexpected, ("extra",))
        self.assertLen(report.mismatched, 2)
        self.assertFalse(report.complete)
        self.assertAllEqual(target["b"], np.ones([4]))
        self.assertAllEqual(target["a"], np.zeros([3, 2]))

    def test_bad_targets(self):
        a, b = tf.Variable(1.0, name="same"), tf.Variable(2.0, name="same")
        with self.assertRaisesRegex(ValueError, "both named 'same'. Pass a dict"):
            towers.named_variables([a, b])
        with self.assertRaisesRegex(TypeError, "got str"):
            towers.named_variables("model")
        with self.assertRaisesRegex(TypeError, "maps str names to tf.Variable"):
            towers.named_variables({"a": 1.0})

    def test_module_names_are_attribute_paths(self):
        class Block(tf.Module):
            def __init__(self):
                super().__init__()
                self.layers = [tf.Variable(1.0), {"w": tf.Variable(2.0)}]
                self.alias = self.layers[0]

        self.assertEqual(list(towers.named_variables(Block())), ["alias", "layers/1/w"])


class BadFilesTest(tf.test.TestCase, parameterized.TestCase):
    def _saved(self, name):
        path = os.path.join(self.get_temp_dir(), name)
        towers.save_weights(_built_model(), path)
        return path

    @parameterized.parameters(*FORMATS)
    def test_truncated_file(self, name):
        path = self._saved(name)
        victim = path
        if os.path.isdir(path):
            victim = next(os.path.join(path, n) for n in os.listdir(path) if ".data-" in n)
        with open(victim, "r+b") as f:
            f.truncate(os.path.getsize(victim) // 2)
        target = _built_model(seed=4)
        before = _snapshot(target)
        with self.assertRaisesRegex(ValueError, "truncated or corrupt"):
            towers.restore_weights(target, path)
        for name_, value in _snapshot(target).items():
            self.assertAllEqual(value, before[name_])

    @parameterized.parameters("w.npz", "w.h5")
    def test_garbage_file(self, name):
        path = os.path.join(self.get_temp_dir(), name)
        with open(path, "wb") as f:
            f.write(os.urandom(1000))
        with self.assertRaisesRegex(ValueError, "holds data of no known weights format"):
            towers.restore_weights(_built_model(), path)

    def test_another_format_behind_a_known_suffix(self):
        npz = self._saved("w.npz")
        disguised = os.path.join(self.get_temp_dir(), "really_npz.h5")
        os.rename(npz, disguised)
        with self.assertRaisesRegex(ValueError, r"really_npz.h5' holds .npz \(numpy\) data"):
            towers.restore_weights(_built_model(), disguised)
        h5_as_npz = os.path.join(self.get_temp_dir(), "really_h5.npz")
        os.rename(self._saved("w.h5"), h5_as_npz)
        with self.assertRaisesRegex(ValueError, r"really_h5.npz' holds .h5 or .hdf5 \(HDF5\) data"):
            towers.restore_weights(_built_model(), h5_as_npz)
        with self.assertRaisesRegex(
            ValueError,
            r"'.*no_suffix' holds .h5 or .hdf5 \(HDF5\) data.*a TensorFlow "
            "checkpoint is a directory or a prefix",
        ):
            os.rename(h5_as_npz, os.path.join(self.get_temp_dir(), "no_suffix"))
            towers.read_weights(os.path.join(self.get_temp_dir(), "no_suffix"))

    def test_corrupt_zip_member(self):
        path = self._saved("w.npz")
        with zipfile.ZipFile(path, "a") as archive:
            archive.writestr("bad.npy", b"not an array")
        with self.assertRaisesRegex(ValueError, "truncated or corrupt"):
            towers.read_weights(path)

    def test_missing_path_names_it_and_the_weights_files_nearby(self):
        missing = os.path.join(self.get_temp_dir(), "nothing.npz")
        with self.assertRaisesRegex(FileNotFoundError, "No weights file at .*nothing.npz'.$"):
            towers.restore_weights(_built_model(), missing)
        directory = os.path.join(self.get_temp_dir(), "run")
        manager = towers.CheckpointManager(directory, _built_model())
        manager.save(5)
        manager.save(12)
        with self.assertRaisesRegex(
            FileNotFoundError,
            r"Weights files there, newest first: \[.*'ckpt-00000012.weights.npz'",
        ):
            towers.restore_weights(_built_model(), directory)
        with self.assertRaisesRegex(FileNotFoundError, "ckpt-00000012"):
            towers.restore_weights(_built_model(), os.path.join(directory, "typo.npz"))

    def test_empty_checkpoint_directory(self):
        with self.assertRaisesRegex(FileNotFoundError, "directory without a TensorFlow checkpoint"):
            towers.restore_weights(_built_model(), self.get_temp_dir())


class NothingLostTest(tf.test.TestCase, parameterized.TestCase):
    """Saving never touches what towers did not write; bad names fail before any write."""

    def test_a_folder_of_someone_elses_files_is_refused_and_left_alone(self):
        folder = os.path.join(self.get_temp_dir(), "results")
        os.mkdir(folder)
        notes = os.path.join(folder, "weights-final.csv")
        with open(notes, "w") as f:
            f.write("epoch,loss\n")
        with self.assertRaisesRegex(
            ValueError, r"holds files towers did not write \(weights-final.csv\).*never "
        ):
            towers.save_weights(_built_model(), folder)
        self.assertEqual(os.listdir(folder), ["weights-final.csv"])

    def test_a_tf_train_checkpoint_folder_is_refused_and_left_alone(self):
        folder = os.path.join(self.get_temp_dir(), "tf_ckpt")
        tf.train.Checkpoint(v=tf.Variable(3.0)).save(os.path.join(folder, "ckpt"))
        before = {n: open(os.path.join(folder, n), "rb").read() for n in os.listdir(folder)}
        latest = tf.train.latest_checkpoint(folder)
        with self.assertRaisesRegex(ValueError, "holds files towers did not write"):
            towers.save_weights(_built_model(), folder)
        after = {n: open(os.path.join(folder, n), "rb").read() for n in os.listdir(folder)}
        self.assertEqual(after, before)
        self.assertEqual(tf.train.latest_checkpoint(folder), latest)

    def test_only_its_own_files_are_replaced_in_its_own_folder(self):
        folder = os.path.join(self.get_temp_dir(), "mine.ckpt")
        towers.save_weights(_built_model(), folder)
        notes = os.path.join(folder, "notes.txt")
        open(notes, "w").close()
        towers.save_weights(_built_model(seed=3), folder)
        self.assertTrue(os.path.exists(notes))
        self.assertIn("towers-weights.json", os.listdir(folder))
        self.assertAllEqual(towers.read_weights(folder)["w1"], _built_model(seed=3).w1)

    def test_a_path_must_be_a_path(self):
        for call in (towers.save_weights, towers.restore_weights):
            with self.assertRaisesRegex(TypeError, "`path` must be a str or os.PathLike; got 3"):
                call(_built_model(), 3)
        with self.assertRaisesRegex(TypeError, "`path` must be a str or os.PathLike"):
            towers.read_weights(None)

    def test_a_folder_holding_only_a_users_checkpoint_file_is_refused(self):
        folder = os.path.join(self.get_temp_dir(), "f")
        os.mkdir(folder)
        with open(os.path.join(folder, "checkpoint"), "w") as f:
            f.write("my notes")
        with self.assertRaisesRegex(ValueError, r"did not write \(checkpoint\)"):
            towers.save_weights(_built_model(), folder)
        self.assertEqual(open(os.path.join(folder, "checkpoint")).read(), "my notes")

    @parameterized.parameters(".towers-weights.json.307.mxz6649u.tmp", ".towers-weights.lock")
    def test_a_folder_another_save_is_claiming_is_towers(self, name):
        """Another process's save has just begun: its lock, or its marker's temporary, is all
        the folder holds. Before: refused as files towers did not write (seen with two savers
        starting together)."""
        folder = os.path.join(self.get_temp_dir(), "f")
        os.mkdir(folder)
        open(os.path.join(folder, name), "w").close()
        towers.save_weights({"w": tf.Variable([1.0])}, folder)
        self.assertAllEqual(towers.read_weights(folder)["w"], [1.0])

    def test_a_users_file_in_its_folder_survives_even_with_a_similar_name(self):
        folder = os.path.join(self.get_temp_dir(), "f")
        towers.save_weights(_built_model(), folder)
        mine = os.path.join(folder, "weights-1a2b3c4d5e6f.csv")
        open(mine, "w").close()
        towers.save_weights(_built_model(), folder)
        self.assertTrue(os.path.exists(mine))

    def test_a_directory_would_not_hide_a_tensorflow_prefix(self):
        prefix = tf.train.Checkpoint(v=tf.Variable(1.0)).write(
            os.path.join(self.get_temp_dir(), "model.ckpt")
        )
        with self.assertRaisesRegex(ValueError, "is the prefix of an existing TensorFlow"):
            towers.save_weights(_built_model(), prefix)
        self.assertFalse(os.path.isdir(prefix))

    def test_two_processes_saving_one_checkpoint_directory_take_turns(self):
        folder = os.path.join(self.get_temp_dir(), "shared")
        go = os.path.join(self.get_temp_dir(), "go")
        code = (  # both save at once: each starts when both are ready
            "import os, time, numpy as np, tensorflow as tf, towers\n"
            "v = {'w': tf.Variable(np.zeros([64, 64], np.float32))}\n"
            "print('ready', flush=True)\n"
            f"while not os.path.exists({go!r}):\n"
            "    time.sleep(0.005)\n"
            "for i in range(6):\n"
            "    v['w'].assign(tf.fill([64, 64], float(i)))\n"
            f"    towers.save_weights(v, {folder!r})\n"
            "print('done')\n"
        )
        children = [
            forked.Popen(
                [sys.executable, "-c", code],
                env=test_util.child_env(),
                stdout=forked.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        self.assertEqual([c.stdout.readline().strip() for c in children], ["ready", "ready"])
        open(go, "w").close()
        outputs = [c.communicate(timeout=240)[0].strip() for c in children]
        self.assertEqual(outputs, ["done", "done"])
        self.assertLen([n for n in os.listdir(folder) if n.endswith(".index")], 1)
        self.assertAllEqual(towers.read_weights(folder)["w"], np.full([64, 64], 5.0))

    def test_h5_checksums_cover_names(self):
        path = os.path.join(self.get_temp_dir(), "w.h5")
        towers.save_weights({"a": tf.Variable(1.0), "b": tf.Variable(2.0)}, path)
        import h5py

        with h5py.File(path, "r+") as f:
            f.move("a", "c")  # what a flipped bit in a name does
        with self.assertRaisesRegex(ValueError, "checksum of 'c' does not match"):
            towers.read_weights(path)

    @parameterized.parameters("w.weights", "w.csv", "model.v2", "w.pt")
    def test_unknown_suffixes_are_refused(self, name):
        path = os.path.join(self.get_temp_dir(), name)
        with self.assertRaisesRegex(ValueError, r"names no weights format. Use .npz .*\.ckpt"):
            towers.save_weights(_built_model(), path)
        self.assertFalse(os.path.exists(path))

    @parameterized.parameters("w.hdf5", "w.ckpt", "W.NPZ")
    def test_documented_suffixes(self, name):
        path = os.path.join(self.get_temp_dir(), name)
        towers.save_weights(_built_model(), path)
        self.assertTrue(towers.restore_weights(_built_model(seed=2), path).complete)

    @parameterized.product(
        name=[
            "",
            "a//b",
            "x/",
            "/x",
            ".",
            "a/./b",
            "a/../b",
            "a\x00b",
            "_CHECKPOINTABLE_OBJECT_GRAPH",
        ],
        path=FORMATS,
    )
    def test_names_no_format_can_hold(self, name, path):
        path = os.path.join(self.get_temp_dir(), path)
        with self.assertRaisesRegex(ValueError, "Weight names must be non-empty"):
            towers.save_weights({name: tf.Variable(1.0), "ok": tf.Variable(2.0)}, path)
        self.assertFalse(os.path.exists(path))

    def test_an_empty_name_never_aborts_the_process(self):
        """It did: TensorFlow's checkpoint writer hits a CHECK failure (exit 134)."""
        path = os.path.join(self.get_temp_dir(), "c")
        out = test_util.run_python(
            "import tensorflow as tf, towers\n"
            "try:\n"
            f"    towers.save_weights({{'': tf.Variable(1.0)}}, {path!r})\n"
            "except ValueError as e:\n"
            "    print('refused')\n"
        )
        self.assertEqual(out.strip(), "refused")

    def test_h5_cannot_hold_a_name_inside_another(self):
        variables = {"a": tf.Variable(1.0), "a/b": tf.Variable(2.0)}
        path = os.path.join(self.get_temp_dir(), "w.h5")
        with self.assertRaisesRegex(ValueError, r"a name inside it .*'a' and 'a/b'"):
            towers.save_weights(variables, path)
        towers.save_weights(variables, os.path.join(self.get_temp_dir(), "w.npz"))  # fine there

    @parameterized.parameters(*FORMATS)
    def test_one_flipped_data_byte_is_an_error_and_nothing_is_assigned(self, name):
        values = np.arange(1000, dtype=np.float32)
        path = os.path.join(self.get_temp_dir(), name)
        towers.save_weights({"a": tf.Variable(values)}, path)
        victim = path
        if os.path.isdir(path):
            victim = next(os.path.join(path, n) for n in os.listdir(path) if ".data-" in n)
        data = bytearray(open(victim, "rb").read())
        data[bytes(data).find(np.float32(500.0).tobytes())] ^= 0x01  # 500.0 -> 500.00003
        with open(victim, "wb") as f:
            f.write(bytes(data))
        target = {"a": tf.Variable(np.zeros(1000, np.float32))}
        with self.assertRaisesRegex(ValueError, "truncated or corrupt"):
            towers.restore_weights(target, path)
        self.assertAllEqual(target["a"], np.zeros(1000))


_SAVER = """
import os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import numpy as np, tensorflow as tf, towers
directory = sys.argv[1]
variables = {f"v{i}": tf.Variable(np.zeros([256, 256], np.float32)) for i in range(6)}
paths = [os.path.join(directory, name) for name in sys.argv[2:]]
i = 0
while True:
    i += 1
    for var in variables.values():
        var.assign(tf.fill(var.shape, float(i)))
    for path in paths:
        towers.save_weights(variables, path)
    if i == 1:
        print("ready", flush=True)
"""


def _leftovers(directory, names=FORMATS):
    """Temporary files and orphan checkpoints a killed save left behind."""
    temps = [
        n
        for n in os.listdir(directory)
        if n.endswith(".tmp") and any(n.startswith(f".{name}.") for name in names)
    ]
    ckpt = os.path.join(directory, "ckpt")
    prefixes = {n.split(".")[0] for n in os.listdir(ckpt) if n.startswith("weights-")}
    return len(temps) + len(prefixes) - 1


class AtomicSaveTest(tf.test.TestCase):
    def test_sigkill_during_saves_leaves_a_loadable_file(self):
        """A saver killed at random moments: each format still holds one whole snapshot."""
        directory = self.get_temp_dir()
        env = test_util.child_env()  # (tests/site on its path: the saver loads no Keras)
        rng = random.Random(0)
        interrupted = 0
        for _ in range(12):  # until a kill landed mid-save; at most 12
            if interrupted >= 1:
                break
            child = forked.Popen(
                [sys.executable, "-c", _SAVER, directory, *FORMATS],
                env=env,
                stdout=forked.PIPE,
                stderr=forked.DEVNULL,
                text=True,
            )
            self.assertEqual(child.stdout.readline().strip(), "ready")
            # A random moment of a save: kill on the n-th look that finds one under way.
            looks, deadline = rng.randint(1, 4), time.monotonic() + 10
            while looks and time.monotonic() < deadline:
                looks -= _leftovers(directory) > 0
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=30)
            interrupted += _leftovers(directory) > 0
            for name in FORMATS:
                arrays = towers.read_weights(os.path.join(directory, name))
                self.assertLen(arrays, 6)
                values = {float(v) for a in arrays.values() for v in np.unique(a)}
                self.assertLen(values, 1, f"{name} mixes snapshots {values}")
        # Saving is nearly all the loop does, so kills land mid-save; the test is not vacuous.
        self.assertGreater(interrupted, 0)
        towers.save_weights({"v0": tf.Variable(1.0)}, os.path.join(directory, "w.npz"))
        towers.save_weights({"v0": tf.Variable(1.0)}, os.path.join(directory, "ckpt"))
        self.assertEqual(_leftovers(directory, names=("w.npz", "ckpt")), 0)

    def test_failed_write_keeps_the_old_file_and_no_temporary(self):
        path = os.path.join(self.get_temp_dir(), "w.npz")
        towers.save_weights({"a": tf.Variable(1.0)}, path)
        with self.assertRaises(TypeError):
            towers.save_weights({"a": tf.Variable(1.0), "s": tf.Variable("text")}, path)
        self.assertEqual(os.listdir(self.get_temp_dir()), ["w.npz"])
        self.assertEqual(float(towers.read_weights(path)["a"]), 1.0)


if __name__ == "__main__":
    tf.test.main()
