"""`finite_flags`: each tensor's all-finite flag, exact, in a few kernels under XLA."""

import numpy as np
import tensorflow as tf
from absl.testing import parameterized

from towers.ops._finite import BLOCK, CHUNK, laid_flags, laid_pairs
from towers.ops.internal import finite_flags


def _tensors(rng: np.random.Generator) -> list[np.ndarray]:
    """Shapes around the block size, a scalar, an empty tensor and three dtypes."""
    shapes = [(3, 5), (), (BLOCK,), (BLOCK + 1,), (BLOCK - 1, 1), (0, 7), (2, BLOCK, 3), (1,)]
    dtypes = [np.float32, np.float64, tf.bfloat16.as_numpy_dtype]
    return [
        rng.normal(size=shape).astype(dtypes[i % len(dtypes)]) for i, shape in enumerate(shapes)
    ]


def _compiled(values: list[tf.Tensor]) -> np.ndarray:
    return tf.function(finite_flags, jit_compile=True, autograph=False)(values).numpy()


class FiniteFlagsTest(parameterized.TestCase, tf.test.TestCase):
    @parameterized.parameters(True, False)
    def test_all_finite(self, laid_out):
        values = [tf.constant(t) for t in _tensors(np.random.default_rng(0))]
        flags = finite_flags(values, laid_out=laid_out).numpy()
        self.assertAllEqual(flags, [True] * len(values))

    @parameterized.parameters(
        (float("nan"), "first"), (float("inf"), "last"), (-float("inf"), "middle")
    )
    def test_each_bad_value_flags_its_tensor_alone(self, bad, where):
        """A bad value at a tensor's first, last (next to its padding) or middle position
        flags that tensor and no other, in the tensors' order across dtypes."""
        base = _tensors(np.random.default_rng(1))
        for i, t in enumerate(base):
            if t.size == 0:
                continue
            spoiled = [x.copy() for x in base]
            flat = spoiled[i].reshape(-1)
            flat[{"first": 0, "last": flat.size - 1, "middle": flat.size // 2}[where]] = bad
            expected = [j != i for j in range(len(base))]
            values = [tf.constant(x) for x in spoiled]
            self.assertAllEqual(_compiled(values), expected, msg=f"tensor {i}")
            self.assertAllEqual(finite_flags(values, laid_out=False), expected)

    def test_more_tensors_than_a_chunk(self):
        rng = np.random.default_rng(2)
        count = 2 * CHUNK + 3
        arrays = [rng.normal(size=(int(n),)).astype(np.float32) for n in rng.integers(1, 99, count)]
        bad = {0, CHUNK - 1, CHUNK, count - 1}
        for i in bad:
            arrays[i][-1] = np.nan
        flags = _compiled([tf.constant(a) for a in arrays])
        self.assertAllEqual(flags, [i not in bad for i in range(count)])

    def test_weights_of_one_shape_are_checked_stacked(self):
        """Tensors of one shape in whole blocks (most weights) are stacked, more than a chunk
        of them, beside others of another shape and padded small ones: each bad value flags
        its own tensor, in order, in one reduction per shape and chunk."""
        rng = np.random.default_rng(3)
        shapes = [(2, BLOCK)] * (CHUNK + 2) + [(BLOCK, 3), (5,), (BLOCK, 3), (7, 3)]
        arrays = [rng.normal(size=shape).astype(np.float32) for shape in shapes]
        bad = {0, CHUNK, CHUNK + 1, CHUNK + 4, len(shapes) - 1}
        for i in bad:
            arrays[i].reshape(-1)[(7 * i) % arrays[i].size] = np.inf
        values = [tf.constant(a) for a in arrays]
        self.assertAllEqual(_compiled(values), [i not in bad for i in range(len(shapes))])
        program = tf.function(finite_flags, jit_compile=True, autograph=False)
        hlo = program.experimental_get_compiler_ir(values, laid_out=True)(stage="hlo")
        self.assertLessEqual(hlo.count(" reduce("), 3 + 2)  # two stacks, one more, one laid

    def test_few_reductions_in_the_program(self):
        """Two reductions per chunk of a dtype (its blocks, then each tensor's range of them)
        and no scatter, not one reduction per tensor: 78 of those took 1.1 ms on the H200,
        and a segment reduction's scatter 0.5 ms."""
        values = [tf.ones([n, 3]) for n in range(1, 2 * CHUNK + 1)]
        program = tf.function(finite_flags, jit_compile=True, autograph=False)
        hlo = program.experimental_get_compiler_ir(values, laid_out=True)(stage="hlo")
        self.assertBetween(hlo.count(" reduce("), 2, 4)
        self.assertNotIn(" scatter(", hlo)
        self.assertAllEqual(program(values), [True] * len(values))

    def test_no_tensors_and_only_empty_ones(self):
        self.assertAllEqual(finite_flags([]).shape, [0])
        self.assertAllEqual(_compiled([tf.zeros([0, 4]), tf.zeros([3, 0])]), [True, True])


# Sizes of tensors laid in one bucket: inside a block, filling blocks, sharing them, empty.
LAID = [[3, 5], [BLOCK], [BLOCK, BLOCK], [BLOCK - 1, 2, 3 * BLOCK + 1], [0, BLOCK + 5, 0, 7], [1]]


def _reference(flat: np.ndarray, sizes: list[int]) -> list[bool]:
    ends = np.cumsum([0, *sizes])
    return [bool(np.isfinite(flat[a:b]).all()) for a, b in zip(ends[:-1], ends[1:])]


class LaidFlagsTest(parameterized.TestCase, tf.test.TestCase):
    @parameterized.parameters(*LAID)
    def test_a_bad_value_flags_its_tensor_alone(self, *sizes):
        """A NaN or Inf anywhere (inside a tensor's whole blocks, in a block two tensors
        share, in the bucket's last part block) flags its tensor only, beside a second
        bucket of another dtype that stays finite."""
        rng = np.random.default_rng(len(sizes))
        length = sum(sizes)
        other = rng.normal(size=9).astype(np.float64)
        compiled = tf.function(laid_flags, jit_compile=True, autograph=False)
        places = {0, length - 1, length // 2, BLOCK - 1, BLOCK, 2 * BLOCK + 1, 3 * BLOCK}
        for place in sorted(p for p in places if p < length):
            for bad in (np.nan, -np.inf):
                flat = rng.normal(size=length).astype(np.float32)
                flat[place] = bad
                want = [_reference(flat, list(sizes)), [True, True]]
                for check in (laid_flags, compiled):
                    got = check([tf.constant(flat), tf.constant(other)], [list(sizes), [4, 5]])
                    self.assertEqual([list(g.numpy()) for g in got], want, msg=f"at {place}")

    def test_few_reductions_and_each_bucket_read_in_place(self):
        """One reduction per bucket over its own rows, then one
        for the blocks inside a tensor and one for the shared ones."""
        buckets = [tf.ones([n * BLOCK + 3]) for n in (1, 2, 3)]
        sizes = [[BLOCK - 5, 8], [BLOCK, BLOCK + 3], [2, 3 * BLOCK + 1]]
        program = tf.function(laid_flags, jit_compile=True, autograph=False)
        hlo = program.experimental_get_compiler_ir(buckets, sizes)(stage="hlo")
        self.assertEqual(hlo.count(" reduce("), len(buckets) + 2)
        for flags in program(buckets, sizes):
            self.assertAllEqual(flags, [True, True])

    def test_the_pairs_compared_grow_with_shared_blocks_times_tensors(self):
        """A bucket's whole blocks count once per tensor of it; a shared block's values
        each once per tensor of it (what `PackedSum.flags` bounds before it lays a check)."""
        self.assertEqual(laid_pairs([[3 * BLOCK]]), 3)
        self.assertEqual(laid_pairs([[1] * 10]), BLOCK * 10)  # one shared part block
        self.assertEqual(laid_pairs([[BLOCK + 1, BLOCK - 1]]), (2 + BLOCK) * 2)  # one shared
        # Each bucket with its own tensors, padded to the largest counts of any bucket:
        self.assertEqual(laid_pairs([[2 * BLOCK], [5, 5]]), 2 * (2 + BLOCK) * 2)

    def test_sizes_must_fill_the_bucket(self):
        with self.assertRaisesRegex(ValueError, "add up"):
            laid_flags([tf.ones([10])], [[3, 4]])
        self.assertEqual([f.shape for f in laid_flags([tf.ones([0])], [[]])], [[0]])


if __name__ == "__main__":
    tf.test.main()
