"""Batch normalization across towers: statistics of the whole batch, moving averages once."""

from collections.abc import Sequence

import tensorflow as tf

from towers.core import cross_tower_sum, current_tower
from towers.ops.internal import check_bool, check_number, library_code
from towers.variables import defer_state_update, updates_state
from towers.workers import current_workers


@library_code
def batch_moments(
    x: tf.Tensor, axes: Sequence[int], *, sync: bool = True
) -> tuple[tf.Tensor, tf.Tensor]:
    """Mean and (biased) variance of `x` over `axes`, over every tower's shard when `sync`.

    The op beneath `towers.BatchNorm`, for layers of your own. With `sync`, inside a tower of
    several, each tower's moments are combined with the others' (weighted by their number of
    elements) through `towers.cross_tower_sum`, gradients included: the result, and the
    gradient of a loss through it, equal those of one device on the whole batch. Otherwise, or
    outside towers, the moments of `x` alone (`tf.nn.moments`).

    Args:
      x: A floating tensor; float16 and bfloat16 are reduced in float32.
      axes: The axes to reduce (e.g. all but the channel axis).
      sync: Whether to combine the moments of every tower.

    Returns:
      `(mean, variance)` in float32, shaped like `x` without `axes`.

    Raises:
      TypeError: if `x` is not floating.
      ValueError: if `axes` is empty, repeats an axis or names one `x` does not have.
    """
    x = tf.convert_to_tensor(x)
    if not x.dtype.is_floating:
        raise TypeError(f"`x` must be floating; got {x.dtype.name}.")
    axes = _checked_axes(axes, x.shape.rank)
    if sync and 0 not in axes:
        raise ValueError(
            f"With sync=True `axes` must include the batch axis 0 (the towers hold different "
            f"examples, not different features); got axes={axes}."
        )
    if not sync:
        return tf.nn.moments(tf.cast(x, tf.float32), axes)
    mean, variance, _ = _moments(x, axes, sync=True)
    return mean, variance


def _checked_axes(axes: Sequence[int], rank: int | None) -> list[int]:
    """`axes` as non-negative ints, checked against `x`'s rank."""
    if rank is None:
        raise ValueError("`x` must have a known rank.")
    if isinstance(axes, int):
        axes = [axes]
    checked = []
    for axis in axes:
        if isinstance(axis, bool) or not isinstance(axis, int) or not -rank <= axis < rank:
            raise ValueError(f"`axes` must be ints in [-{rank}, {rank}); got {axes!r}.")
        checked.append(axis % rank)
    if not checked or len(set(checked)) != len(checked):
        raise ValueError(f"`axes` must name distinct axes, at least one; got {axes!r}.")
    return checked


class BatchNorm(tf.Module):
    """Batch normalization whose statistics span the towers, updated once per step.

    Called as `bn(x, training=...)`; normalizes the last axis. In training, `x` is normalized by
    its batch's mean and variance and the moving averages move towards them:
    `moving = momentum * moving + (1 - momentum) * batch statistic`; in inference the moving
    averages normalize. The variables, made on the first call: `gamma` and `beta`
    (trainable) and `moving_mean`, `moving_variance` (not trainable).

    * `sync=True`: the statistics are those of the whole global batch, combined across towers
      inside the graph (weighted by shard size); output, gradients and moving averages equal
      one device's on the whole batch, so the equivalence promise covers BatchNorm models.
    * `sync=False`: each tower normalizes by its own shard's statistics (no exchange in the
      backward pass); the moving averages still move once per step, towards the statistics of
      the whole batch.

    Which tower updates the moving averages follows `towers.updates_state()`: every copy of
    `towers.Replicated` updates its own (from identical statistics, so copies stay
    bit-identical); towers sharing one copy (`ParameterServer`) leave it to the first tower.
    The variance is the batch's biased variance (as Keras' BatchNormalization keeps it). In a
    v1 graph the update runs whenever the output is evaluated. With `train_step(...,
    micro_batches=M)` each part is a batch of its own: normalized by its statistics, moving the
    averages once (as one device running the same micro-batches would).

    Args:
      momentum: Weight of the old moving average, in [0, 1).
      epsilon: Added to the variance, > 0.
      sync: Whether the statistics span every tower (see above).
      name: The module's name.

    Raises:
      TypeError: if `momentum` or `epsilon` is not a number, or `sync` not a bool.
      ValueError: if `momentum` or `epsilon` is out of range.

    Example:
      >>> self.bn = towers.BatchNorm(sync=True)
      >>> y = tf.nn.relu(self.bn(conv(x), training=True))
    """

    def __init__(
        self,
        momentum: float = 0.99,
        epsilon: float = 1e-3,
        sync: bool = False,
        name: str | None = None,
    ):
        super().__init__(name=name)
        self.momentum = check_number(momentum, "momentum", minimum=0.0, below=1.0)
        self.epsilon = check_number(epsilon, "epsilon", above=0.0)
        self.sync = check_bool(sync, "sync")
        self.built = False

    @library_code
    def __call__(self, x: tf.Tensor, training: bool) -> tf.Tensor:
        """Normalizes `x` over all axes but the last.

        Args:
          x: A floating tensor of known rank >= 2, channels last.
          training: Whether to normalize by batch statistics and update the moving averages
            (a Python bool: the towers must agree on it while the graph is built).

        Returns:
          The normalized tensor, of `x`'s shape and dtype.

        Raises:
          TypeError: if `training` is not a Python bool or `x` not floating.
          ValueError: if `x` has unknown rank, rank < 2, or an unknown channel count.
        """
        x = tf.convert_to_tensor(x)
        if not isinstance(training, bool):  # (not check_bool: the message says more)
            raise TypeError(
                f"`training` must be a Python bool; got {training!r}. Build one step for "
                "training and another for inference."
            )
        if not x.dtype.is_floating:
            raise TypeError(f"`x` must be floating; got {x.dtype.name}.")
        if x.shape.rank is None or x.shape.rank < 2 or x.shape[-1] is None:
            raise ValueError(
                f"`x` must have a known rank >= 2 and a known last (channel) axis; got shape "
                f"{x.shape}."
            )
        if not self.built:
            self._build(x.shape[-1])
        axes = list(range(x.shape.rank - 1))
        if not training:
            mean, variance = self.moving_mean, self.moving_variance
            return self._normalized(x, mean, variance)
        mean, variance, (inputs, prepare) = _moments(x, axes, sync=self.sync)
        y = self._normalized(x, mean, variance)
        tower = current_tower()
        # Every tower takes part in the exchange (`prepare`), whether it updates state or not.
        update, writes = _no_update, ()
        if updates_state():
            update, writes = self._update_moving, (self.moving_mean, self.moving_variance)
        if defer_state_update(update, tower and tower.device, inputs, prepare, writes=writes):
            return y  # the step builds it with the update, after its non-finite verdict
        built = update(*(prepare(*inputs) if prepare else inputs))
        if not built:
            return y
        with tf.control_dependencies(built):  # a v1 graph runs the update with the output
            return tf.identity(y)

    def _build(self, channels: int) -> None:
        with tf.name_scope(self.name):
            self.gamma = tf.Variable(tf.ones([channels]), name="gamma")
            self.beta = tf.Variable(tf.zeros([channels]), name="beta")
            self.moving_mean = tf.Variable(tf.zeros([channels]), trainable=False, name="mean")
            self.moving_variance = tf.Variable(
                tf.ones([channels]), trainable=False, name="variance"
            )
        self.built = True

    def _normalized(self, x: tf.Tensor, mean, variance) -> tf.Tensor:
        inverse = tf.math.rsqrt(variance + self.epsilon) * self.gamma
        shift = self.beta - mean * inverse
        return tf.cast(tf.cast(x, tf.float32) * inverse + shift, x.dtype)

    def _update_moving(self, mean: tf.Tensor, variance: tf.Tensor) -> list:
        keep = tf.constant(self.momentum, tf.float32)
        return [
            self.moving_mean.assign(self.moving_mean * keep + mean * (1.0 - keep)),
            self.moving_variance.assign(self.moving_variance * keep + variance * (1.0 - keep)),
        ]


def _moments(x: tf.Tensor, axes: Sequence[int], *, sync: bool):
    """(mean, variance) to normalize by, and what the moving averages move towards.

    The latter is `(inputs, prepare)`: the whole batch's statistics are `prepare(*inputs)`,
    or `inputs` themselves when `prepare` is None. Each tower's sums (element count n,
    n * mean, n * variance and n * mean^2) are combined across towers; the combined variance
    is the mean of the towers' variances plus the variance of their means, which keeps
    float32 cancellation to the means alone. With `sync` they are combined now (the
    normalization needs them, gradients included); without, by `prepare` (no gradient),
    which a compiled tower runs after its program (XLA cannot exchange mid-way).
    """
    x32 = tf.cast(x, tf.float32)
    mean, variance = tf.nn.moments(x32, axes)
    tower = current_tower()
    if tower is None or tower.num_towers * current_workers().num_workers == 1:
        return mean, variance, ((tf.stop_gradient(mean), tf.stop_gradient(variance)), None)
    shape = tf.shape(x32)
    count = tf.cast(tf.reduce_prod(tf.gather(shape, list(axes))), tf.float32)
    local = tf.concat([[count], count * mean, count * variance, count * tf.square(mean)], 0)
    if not sync:
        return mean, variance, ((tf.stop_gradient(local),), _whole_batch)
    whole_mean, whole_variance = _statistics(cross_tower_sum(local, weight=count))
    moving = (tf.stop_gradient(whole_mean), tf.stop_gradient(whole_variance))
    return whole_mean, whole_variance, (moving, None)


def _no_update(mean: tf.Tensor, variance: tf.Tensor) -> list:
    """The update of a tower that leaves the moving averages to another: none.

    It still took part in the exchange; its op waits for it, so that whatever waits for the
    step's updates (the "raise" check) waits for every tower's exchange too.
    """
    return [tf.group(mean, variance, name="exchanged")]


def _statistics(sums: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """(mean, variance) from the summed (n, n * mean, n * variance, n * mean^2)."""
    n, rest = sums[0], tf.reshape(sums[1:], [3, -1])
    mean = rest[0] / n
    return mean, (rest[1] + rest[2]) / n - tf.square(mean)


def _whole_batch(local: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """The whole batch's (mean, variance) from this tower's sums, exchanged (no gradient)."""
    return _statistics(cross_tower_sum(local))
