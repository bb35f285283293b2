"""All-reducing `K x N` tower gradients: every tower gets the weighted mean, on its device."""

from collections.abc import Sequence

from towers.ops._all_reduce.base import AllReduce
from towers.ops._all_reduce.by_name import all_reduce_algorithm
from towers.ops._all_reduce.checks import check_wire_dtype
from towers.ops._all_reduce.terms import sends_values
from towers.ops._autograph import library_code
from towers.ops._collectives import collective_order
from towers.ops._crossed_flags import Crossing, crossing
from towers.ops._device_scope import holds
from towers.ops._exact_widening import HALF, narrow_columns
from towers.ops._gathered_slices import gathered_slices
from towers.ops._packed_sum import PackedSum, packed_gradients
from towers.ops._packing import PackSpec, check_bucket_bytes, pack, pack_spec
from towers.ops._tensorflow import tf
from towers.ops._tower_grads import (
    Gradient,
    check_column,
    check_tower_grads,
    column_dtype,
    dense_column,
)
from towers.ops._weighted_mean import (
    Weight,
    checked_weights,
    equal_weights,
    normalized_weights,
    scale,
    weight_in,
)

SPARSE_MODES = ("gather", "dense")


@library_code
def all_reduce_gradients(
    tower_grads: Sequence[Sequence[Gradient]],
    devices: Sequence[str],
    *,
    weights: Sequence[Weight] | None = None,
    algorithm: str | AllReduce = "auto",
    bucket_bytes: int | None = 4 * 2**20,
    wire_dtype: tf.DType | None = None,
    sparse: str = "gather",
    variables: Sequence[tf.Variable] | None = None,
) -> list[list[Gradient]]:
    """All-reduces tower gradients so that every tower holds their weighted mean.

    The replicated-variables counterpart of `average_gradients`: tower i's result is on
    `devices[i]`, and all towers' results are equal (bitwise for every algorithm here), so
    applying them keeps replicated variables identical.

    * Dense gradients are scaled by their tower's weight, packed into buckets of at most
      `bucket_bytes` (so the number of all-reduces grows with bytes, not variables), summed
      by `algorithm`, and unpacked.
    * With an `algorithm` whose group reaches beyond `devices` (other workers' towers), the
      weights are divided by the sum of every tower's weight: packed buckets carry it in
      their sum (one element more, no extra all-reduce); without packing, or with
      `wire_dtype`, it is all-reduced first. Without weights the mean is over the group.
    * `tf.IndexedSlices` are gathered from every tower (`sparse="gather"`), staying sparse
      with each row once (repeated rows summed once, on the first device, so every device
      gets the same bits), or made dense first (`sparse="dense"`). A mix of sparse and
      dense becomes dense, and so do slices when `algorithm`'s group reaches beyond
      `devices` (other workers').
    * float16/bfloat16 gradients are reduced in float32; `wire_dtype` instead sends float32
      values as float16/bfloat16 between devices (the plain-op algorithms still add in
      float32). Each tower's gradient is scaled by its weight before it is cast (partial
      sums stay within S = sum_i |w_i g_i|), so per element the error is at most
      K * (u * S + m), u the wire dtype's unit roundoff (2**-11 float16, 2**-8 bfloat16) and
      m half its smallest subnormal (2**-25 float16, 2**-134 bfloat16: float16 values below
      about 3e-8 arrive as 0); it overflows only when S exceeds the largest finite value
      / (1 + u)**K (65504 / (1 + 2**-11)**K for float16, e.g. 65376 for K = 4).
    * float32 gradients that are casts of float16/bfloat16 ones (mixed precision's) are
      packed in that dtype on two devices with equal weights, and moved so where
      `algorithm` only moves values (`gather_add`; not NCCL, which adds on the wire): each
      device widens them as it adds them, the same sums in half the bytes
      (`towers.ops._exact_widening`). Other algorithms get the buckets widened first.
    * One tower (and no other worker's) holds its mean already: its dense gradients come
      back as they are (times a weight given as a tensor), nothing packed or sent.
    * None in every tower stays None; None in some towers only is an error.

    Args:
      tower_grads: K lists of N gradients, tower i's on `devices[i]`.
      devices: The K tower devices.
      weights: K weights (shard sizes), normalized; None for the plain mean.
      algorithm: A name from `ops.ALGORITHMS` or an `ops.AllReduce`.
      bucket_bytes: The largest bucket; None to all-reduce each gradient on its own.
      wire_dtype: None, tf.float16 or tf.bfloat16.
      sparse: "gather" or "dense".
      variables: The N variables of tower 0, optional, to name them in errors and check
        each gradient's shape and dtype against its variable's.

    Returns:
      K lists of N gradients.

    Raises:
      ValueError: if the towers disagree on N or K disagrees with `devices`, a gradient is
        None in some towers only, towers (or `variables`) disagree on a gradient's shape or
        dtype, or an argument is unknown.
      TypeError: if a gradient is neither a tensor, `tf.IndexedSlices` nor None, or is not
        floating-point.
    """
    tower_grads = check_tower_grads(tower_grads, variables)
    devices = list(devices)
    if len(devices) != len(tower_grads):
        raise ValueError(
            f"`devices` must have one device per tower; got {len(devices)} devices for "
            f"{len(tower_grads)} towers."
        )
    check_options(bucket_bytes, wire_dtype, sparse)
    with collective_order():  # in a v1 graph, this step's collectives chain among themselves
        algorithm = all_reduce_algorithm(algorithm)
        beyond = algorithm.group_size(len(devices)) != len(devices)  # other workers' too
        norm, carry = weights_of(weights, devices, algorithm, bucket_bytes, wire_dtype)
        gather = sparse == "gather" and not beyond  # gathering reaches these devices only
        alone = len(devices) == 1 and not beyond  # one tower's mean is its own gradient
        out: list[list[Gradient]] = [[None] * len(tower_grads[0]) for _ in devices]
        dense_columns = []
        for j, column in enumerate(zip(*tower_grads)):
            variable = variables[j] if variables is not None else None
            if not check_column(column, f"#{j}" if variable is None else variable.name, variable):
                continue
            if gather and all(isinstance(g, tf.IndexedSlices) for g in column):
                for i, gathered in enumerate(gathered_slices(list(column), devices, norm)):
                    out[i][j] = gathered
            elif alone:  # nothing to pack or send: a pass over every gradient saved
                (dense,) = dense_column(list(column), devices, variable, wide=False)
                one = isinstance(norm[0], float) and norm[0] == 1.0  # (else a tensor's share)
                with tf.device(devices[0]):  # (a copy there only if made elsewhere)
                    if not one:
                        dense = scale(dense, norm[0])
                    elif not holds(devices[0], dense.device):
                        dense = tf.identity(dense)
                out[0][j] = dense
            else:
                dense_columns.append((j, dense_column(list(column), devices, variable)))
        if dense_columns:
            reduced = _reduce_dense(
                [c for _, c in dense_columns],
                devices,
                norm,
                algorithm,
                bucket_bytes,
                wire_dtype,
                carry,
                [column_dtype(tower_grads, j) for j, _ in dense_columns],
            )
            for i in range(len(devices)):
                for (j, _), value in zip(dense_columns, reduced[i]):
                    out[i][j] = value
        return out


def weights_of(
    weights: Sequence[Weight] | None,
    devices: list,
    algorithm: AllReduce,
    bucket_bytes: int | None,
    wire_dtype: tf.DType | None,
) -> tuple[list[Weight], bool]:
    """(each tower's weight, whether the packed sum carries the weights' total).

    Beyond these devices the weights' total is every worker's: packed buckets carry it in
    their sum (one element more, the weights left as they are), anything else all-reduces it
    first. Without weights, the mean is over the whole group.
    """
    group = algorithm.group_size(len(devices))
    weights = None if weights is None else checked_weights(weights)
    if weights is not None and any(isinstance(w, (int, float)) and w < 0 for w in weights):
        raise ValueError(f"`weights` must be non-negative; got {list(weights)}.")
    if group == len(devices) or weights is None:
        return normalized_weights(weights, group, "all_reduce_gradients")[: len(devices)], False
    if bucket_bytes is not None and wire_dtype is None:
        return normalized_weights(weights, len(devices), "all_reduce_gradients", 1.0), True
    total = _total(weights, devices, algorithm)
    return normalized_weights(weights, len(devices), "all_reduce_gradients", total), False


def _total(weights: Sequence[Weight], devices: list, algorithm: AllReduce) -> tf.Tensor:
    """The sum of the weights of every tower of `algorithm`'s group, all-reduced.

    When the group reaches beyond `devices`, this process's towers hold part of the batch:
    dividing by their own sum would give workers x the mean.
    """
    local = []
    for weight, device in zip(weights, devices):
        with tf.device(device):
            local.append(tf.cast(weight, tf.float32))
    return algorithm(local, devices)[0]


def check_options(bucket_bytes: int | None, wire_dtype: tf.DType | None, sparse: str) -> None:
    """Checks the options of `all_reduce_gradients` (also where they are first given).

    Raises:
      ValueError: naming the option, the value received and what it may be.
    """
    check_bucket_bytes(bucket_bytes)
    check_wire_dtype(wire_dtype)
    if sparse not in SPARSE_MODES:
        raise ValueError(f"`sparse` must be one of {SPARSE_MODES}; got {sparse!r}.")


def _reduce_dense(
    columns: list[list[tf.Tensor]],
    devices: list,
    weights: list,
    algorithm: AllReduce,
    bucket_bytes: int | None,
    wire_dtype,
    carry: bool,
    dtypes: list[tf.DType],
) -> list[list[tf.Tensor]]:
    """The weighted sum of N columns of K tensors, packed in buckets; returns K lists of N.

    Weights apply to whole buckets: before the sum when they differ or values travel in a
    narrower dtype (one multiply per tower and bucket; a scaled sum cannot overflow where the
    mean does not), after it otherwise (one per device and bucket). With `carry` the weights
    are not normalized: a one packed after the gradients sums to the weights' total, which
    every bucket is divided by (the last element of its bucket, since it is packed last).
    Columns of exact float32 gradients of half-precision ones are packed narrow on two devices
    with equal weights (`_summable`). Each result is cast back to its column's dtype
    (`dtypes`) on its device. Each device's results are a `PackedSum`'s (its buckets'
    terms, the weight, the division, the casts): a compiled update reading them takes those
    steps itself. Buckets whose terms are the two towers' own (`gather_add`) carry each
    tower's flags of its term (`Crossing`), for the guard in such an update.
    """
    k = len(devices)
    equal = equal_weights(weights) and wire_dtype is None
    if equal and k == 2 and algorithm.group_size(k) == k:  # see `_summable`
        columns = narrow_columns(columns)
    per_tower = [[column[i] for column in columns] for i in range(k)]
    if carry:
        for tensors, device in zip(per_tower, devices):
            with tf.device(device):
                tensors.append(tf.ones([1], tf.float32))
    spec = (
        pack_spec(per_tower[0], bucket_bytes)
        if bucket_bytes is not None
        else PackSpec(
            tuple((j,) for j in range(len(columns))), tuple(t.shape for t in per_tower[0])
        )
    )
    packed = []
    for tensors, device, weight in zip(per_tower, devices, weights):
        with tf.device(device):
            buckets = pack(tensors, spec)
            packed.append(buckets if equal else [b * weight_in(weight, b.dtype) for b in buckets])
    terms, crosses = [], []
    factor = weights[0] if equal else None
    for b in range(len(spec.buckets)):
        values = _summable([packed[i][b] for i in range(k)], devices, algorithm)
        wire = wire_for(values[0], wire_dtype)
        terms.append(algorithm.sum_terms(values, devices, wire_dtype=wire))
        crosses.append(crossing(values, devices, algorithm, wire, factor, carry))
    crossed, dtypes = Crossing.of(packed, spec, devices, crosses), dtypes + [tf.float32] * carry
    out = []
    for i, device in enumerate(devices):
        with tf.device(device):
            mine = [bucket[i] for bucket in terms]
            summed = PackedSum(mine, spec, factor, dtypes, carry, crossed and (crossed, i))
            out.append(packed_gradients(summed, len(columns)))
    return out


def _summable(values: list[tf.Tensor], devices: list, algorithm: AllReduce) -> list[tf.Tensor]:
    """A bucket's values as `algorithm` may sum them: half-precision ones widened first.

    Half-precision values here are exact float32 gradients (`towers.ops._exact_widening`),
    packed as they are when two devices share equal weights: each element's sum is then one
    addition, the same bits in any bucket layout. Where `algorithm` only moves them
    (`sends_values`: `gather_add`) they cross narrow and the devices widen them as they add
    them (`PackedSum`); elsewhere they are widened here.
    """
    if values[0].dtype not in HALF or sends_values(algorithm, values, devices):
        return values
    out = []
    for value, device in zip(values, devices):
        with tf.device(device):
            out.append(tf.cast(value, tf.float32))
    return out


def wire_for(value: tf.Tensor, wire_dtype: tf.DType | None) -> tf.DType | None:
    """Compress only float32 (or wider) values; half values already travel small."""
    return wire_dtype if value.dtype in (tf.float32, tf.float64) else None
