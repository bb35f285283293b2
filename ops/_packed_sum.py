"""Reduced gradients whose last steps a compiled program that uses them can take itself.

After the exchange, each device holds per bucket the terms of its sum (the sum, or with
`gather_add` both towers' buckets: `AllReduce.sum_terms`); the gradients are the terms
added, scaled by the mean's weight, unpacked and cast back. Built as ops, each of those
steps is a pass over every gradient (and the update program's arguments are the N
gradients). A compiled update that takes the terms instead adds, scales and slices them as
it reads them: no pass of their own, and a few buckets as arguments. `PackedSum` records
the steps; the gradients built from it are noted on their graph, so that such a program
finds them (`packed_origin`) and rebuilds them from the terms inside. Nothing depends on the
program doing so: the ops built here give the same values, and TensorFlow prunes them when
nothing reads them.
"""

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from towers.ops._all_reduce.gather_add import added
from towers.ops._exact_widening import narrowest
from towers.ops._finite import LAID_LIMIT, laid_flags, laid_pairs
from towers.ops._packing import PackSpec, unpack
from towers.ops._tensorflow import tf
from towers.ops._weighted_mean import accumulation_dtype, weight_in

# The graph's attribute: the name of a tensor packed_gradients built -> (PackedSum, index). On
# the graph itself, so that it goes with the graph (its tensors hold the graph: a table held
# outside it, even weakly keyed, would keep every graph alive).
_NOTES = "_towers_packed_sums"


@dataclasses.dataclass(eq=False)
class PackedSum:
    """One device's reduced gradients as their buckets' terms.

    Attributes:
      terms: For each bucket of `spec`, the one or two tensors whose sum it is; half
        precision ones (exact float32 gradients sent narrow) are widened before they add.
      spec: How the gradients were packed.
      factor: What each summed bucket is multiplied by (the mean's weight, a number), or
        None.
      dtypes: Each gradient's dtype (sums of half-precision gradients are float32).
      divided: Whether the last packed tensor is a one summed to the weights' total (other
        workers' towers included), which every summed bucket is divided by.
      crossed: `(crossing, i)`: this is device i's sum of a `Crossing`, whose buckets'
        terms are checked where they are made and their flags sent with them
        (`towers.ops._crossed_flags`); None: the sums themselves are checked.
    """

    terms: list[list[tf.Tensor]]
    spec: PackSpec
    factor: float | None
    dtypes: list[tf.DType]
    divided: bool = False
    crossed: tuple[Any, int] | None = None

    def summed(self, terms: Sequence[Sequence[tf.Tensor]] | None = None) -> list[tf.Tensor]:
        """Each bucket summed from `terms` (default this sum's own), scaled and divided."""
        terms = self.terms if terms is None else terms
        buckets = [added([tf.cast(x, accumulation_dtype(x.dtype)) for x in t]) for t in terms]
        if self.factor is not None:
            buckets = [b * weight_in(self.factor, b.dtype) for b in buckets]
        if self.divided:
            last = len(self.spec.shapes) - 1
            total = next(b for b, m in zip(buckets, self.spec.buckets) if last in m)[-1]
            buckets = [b / tf.cast(total, b.dtype) for b in buckets]
        return buckets

    def gradients(self, terms: Sequence[Sequence[tf.Tensor]] | None = None) -> list[tf.Tensor]:
        """The gradients, built from `terms` (default this sum's own), in the device scope."""
        return self.unpacked(self.summed(terms))

    def unpacked(self, summed: Sequence[tf.Tensor]) -> list[tf.Tensor]:
        """The gradients in the summed buckets `summed`, shaped and cast back."""
        return [tf.cast(g, d) for g, d in zip(unpack(summed, self.spec), self.dtypes)]

    def crossed_flags(self) -> list:
        """Per bucket, its terms' flags on this device (None: the sum is read), or []."""
        if self.crossed is None:
            return []
        crossing, i = self.crossed
        return crossing.flags_on(i)

    def flags(
        self, summed: Sequence[tf.Tensor], crossed: Sequence[Sequence[tf.Tensor] | None] = ()
    ) -> dict[int, tf.Tensor]:
        """Whether each gradient is all finite, read in the summed buckets `summed`.

        A bucket with crossed flags (`crossed`, in the program: `crossed_flags()`'s) is
        judged by its terms' flags, not read again. Only gradients whose dtype is their
        bucket's (the cast back changes nothing): a narrower one may overflow in its cast,
        so it is left out, for a check of its own; and none where the buckets hold too many
        small gradients (`laid_pairs`).

        Returns:
          Gradient index -> its flag (a boolean scalar).
        """
        sizes = self.spec.sizes
        if laid_pairs(sizes) > LAID_LIMIT:  # many small gradients: checked one by one
            return {}
        crossed = list(crossed) or [None] * len(summed)
        read = [b for b, given in enumerate(crossed) if given is None]
        laid = dict(zip(read, laid_flags([summed[b] for b in read], [sizes[b] for b in read])))
        return self._by_gradient(crossed, laid)

    def flags_where_made(self) -> tf.Tensor | None:
        """`flags` as one vector, from the terms' flags where each device made them.

        The same booleans as `flags` in a program that reads `crossed_flags()`, computed in
        the caller's scope (for the host's check, before the buckets have crossed): each
        bucket's terms' flags combined, the buckets laid end to end (each gradient's
        position: `_places_where_made`). None, with nothing built, where some bucket's sum
        is read instead.
        """
        if self._places_where_made() is None:
            return None
        vectors = [tf.reduce_all(tf.stack(given), 0) for given in self.crossed[0].flags_made()]
        return tf.concat(vectors, 0) if len(vectors) > 1 else vectors[0]

    def _places_where_made(self) -> dict[int, int] | None:
        """Each gradient's position in `flags_where_made`'s vector, or None (see there)."""
        if self.crossed is None or len(self.crossed[0].chosen) < len(self.spec.buckets):
            return None
        starts = np.cumsum([0] + [len(members) for members in self.spec.buckets])
        return {i: int(starts[b]) + j for i, (b, j) in self._placed().items()}

    def _by_gradient(self, crossed: Sequence, laid: dict) -> dict[int, tf.Tensor]:
        """Each gradient's flag: its bucket's (its terms' flags, or `laid[b]`) at its place."""
        per_bucket = [
            laid[b] if given is None else tf.reduce_all(tf.stack(given), 0)
            for b, given in enumerate(crossed)
        ]
        return {i: per_bucket[b][j] for i, (b, j) in self._placed().items()}

    def _placed(self) -> dict[int, tuple[int, int]]:
        """Gradient index -> (bucket, place in it), where the gradient's dtype is the sum's.

        (Where it is not, the cast back may overflow: see `flags`.)
        """
        found = {}
        for b, members in enumerate(self.spec.buckets):
            summed_dtype = accumulation_dtype(self.terms[b][0].dtype)
            for j, i in enumerate(members):
                if i < len(self.dtypes) and self.dtypes[i] == summed_dtype:
                    found[i] = (b, j)
        return found


def packed_gradients(packed: PackedSum, count: int) -> list[tf.Tensor]:
    """The first `count` gradients of `packed`, built here and noted as its (in a graph)."""
    out = packed.gradients()[:count]
    if not tf.executing_eagerly():
        for i, grad in enumerate(out):
            notes = getattr(grad.graph, _NOTES, None)
            if notes is None:
                notes = {}
                setattr(grad.graph, _NOTES, notes)
            notes[grad.name] = (packed, i)
    return out


def packed_origin(tensor: object) -> tuple[PackedSum, int] | None:
    """`(packed, i)` if `tensor` is gradient i built by `packed_gradients`, else None."""
    if not isinstance(tensor, tf.Tensor) or tf.executing_eagerly():
        return None
    return getattr(tensor.graph, _NOTES, {}).get(tensor.name)


def packed_arguments(
    grads: Sequence[object], checked: bool = False
) -> tuple[list, list, Callable[..., Any]]:
    """`grads` as a compiled program's arguments: `PackedSum`s' gradients by their terms.

    A float32 gradient that is exactly a half-precision one (`narrow_form`: under mixed
    precision, the cast of a tower's gradient) comes as that one and is widened inside,
    where the cast fuses into the reads: outside, it would be a kernel of its own on an
    uncompiled step's GPU, and the program would read twice the bytes.

    With `checked` (a program that judges the gradients), each sum's crossed flags come
    with its terms (`PackedSum.crossed_flags`).

    Returns:
      `(given, terms, rebuilt)`: `grads` with None where a gradient is a `PackedSum`'s (and
      narrow forms where they have one), the terms of each such sum, and a function that,
      inside the program, builds the gradient list again from those two (each sum's
      gradients built from its terms there).
      `rebuilt(given, terms, checked=True)` returns `(grads, known)`, `known` the
      all-finite flags of the sums' gradients read in their buckets (`laid_flags`) or
      crossed with their terms (`PackedSum.crossed`), by position in `grads`; a gradient
      not in it is for the caller to check. Each sum's terms come as `(terms, crossed)`.
    """
    sums: dict[int, PackedSum] = {}
    where, given = [], list(grads)
    for position, grad in enumerate(grads):
        origin = packed_origin(grad)
        if origin is not None:
            packed, index = origin
            sums.setdefault(id(packed), packed)
            where.append((position, id(packed), index))
            given[position] = None
    narrow = [narrowest(grad) for grad in given]
    widened = [form is not grad for form, grad in zip(narrow, given)]
    given = narrow
    order = list(sums)

    def rebuilt(given: list, terms: list, checked: bool = False) -> Any:
        summed = {key: sums[key].summed(t) for key, (t, _) in zip(order, terms)}
        built = {key: sums[key].unpacked(summed[key]) for key in order}
        out = [tf.cast(g, tf.float32) if wide else g for g, wide in zip(given, widened)]
        for position, key, index in where:
            out[position] = built[key][index]
        if not checked:
            return out
        flags = {key: sums[key].flags(summed[key], c) for key, (_, c) in zip(order, terms)}
        known = {p: flags[key][i] for p, key, i in where if i in flags[key]}
        return out, known

    crossed = {key: sums[key].crossed_flags() if checked else [] for key in order}
    return given, [(sums[key].terms, crossed[key]) for key in order], rebuilt


def flags_where_made(grads: Sequence[object]) -> tf.Tensor | None:
    """`grads`' all-finite flags as a program judging them has them, or None.

    For gradients all of `PackedSum`s whose every bucket's terms were checked where they
    were made (`PackedSum.flags_where_made`): one vector, computed in the caller's scope
    from those flags. None, with nothing built, where some gradient's flag needs its sum
    read.
    """
    sums, where = {}, []
    for grad in grads:
        origin = packed_origin(grad)  # (None for slices and gradients not all-reduced here)
        if origin is None:
            return None
        sums.setdefault(id(origin[0]), origin[0])
        where.append((id(origin[0]), origin[1]))
    places = {key: packed._places_where_made() for key, packed in sums.items()}
    if not where or any(at is None for at in places.values()):
        return None
    if any(i not in places[key] for key, i in where):
        return None
    vectors, starts = [], {}
    for key, packed in sums.items():
        starts[key] = sum(int(v.shape[0]) for v in vectors)
        vectors.append(packed.flags_where_made())
    positions = [starts[key] + places[key][index] for key, index in where]
    flat = tf.concat(vectors, 0) if len(vectors) > 1 else vectors[0]
    return flat if positions == list(range(int(flat.shape[0]))) else tf.gather(flat, positions)
