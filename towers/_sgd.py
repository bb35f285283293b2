"""A plain SGD optimizer (with optional momentum), so a training step needs nothing else."""

from collections.abc import Iterable

from towers._optimizer import StatefulOptimizer
from towers._variable_names import Copies, canonical_name
from towers.ops._tensorflow import tf


class SGD(tf.Module, StatefulOptimizer):
    """Stochastic gradient descent: `v -= lr * g`, or with momentum `m = mu * m + g; v -= lr * m`.

    Updates are built on each variable's device. Sparse gradients (`tf.IndexedSlices`) update
    only their rows when there is no momentum. Momentum slots live next to their variables,
    keyed by the variable's name in `optimizer.slots`; `build(variables)` creates them up
    front (a checkpoint restore needs them), else the first `apply_gradients` does.

    Args:
      learning_rate: The step size, a float or a scalar tensor or variable.
      momentum: The momentum coefficient in [0, 1); 0 for plain SGD, which keeps no state.
      name: The module's name.

    Raises:
      TypeError: if `learning_rate` or `momentum` is not a number (or `learning_rate` a
        scalar tensor or variable).
      ValueError: if `learning_rate` is negative or `momentum` is outside [0, 1).
    """

    _TF_MODULE_IGNORED_PROPERTIES = tf.Module._TF_MODULE_IGNORED_PROPERTIES | {"_slot_of"}

    def __init__(
        self, learning_rate: float | tf.Tensor = 0.01, momentum: float = 0.0, name: str = "SGD"
    ):
        super().__init__(name=name)
        _check_learning_rate(learning_rate)
        if isinstance(momentum, bool) or not isinstance(momentum, (int, float)):
            raise TypeError(f"`momentum` must be a number in [0, 1); got {momentum!r}.")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"`momentum` must be in [0, 1); got momentum={momentum}.")
        self.learning_rate = learning_rate
        self.momentum = momentum
        self.slots: dict[str, tf.Variable] = {}  # variable name (no ":0") -> momentum
        self._slot_of: dict = {}  # variable.ref() -> its momentum slot

    @tf.autograph.experimental.do_not_convert
    def apply_gradients(
        self, grads_and_vars: Iterable[tuple[tf.Tensor | tf.IndexedSlices | None, tf.Variable]]
    ) -> tf.Operation | None:
        """Applies one update per `(gradient, variable)` pair; None gradients are skipped.

        Args:
          grads_and_vars: Pairs of gradient and variable.

        Returns:
          An op grouping the updates (None when executing eagerly).
        """
        updates, rates = [], {}
        for grad, var in grads_and_vars:
            if grad is None:
                continue
            with tf.device(var.device), tf.name_scope(self.name):
                # One learning-rate tensor per device and dtype, not one per variable.
                key = (var.device, var.dtype)
                if key not in rates:
                    rates[key] = tf.cast(self.learning_rate, var.dtype)
                updates.append(self._update(grad, var, rates[key]))
        return tf.group(updates)

    def build(self, variables: Iterable[tf.Variable]) -> None:
        """Creates the optimizer's state for `variables` (momentum slots; none without momentum).

        Args:
          variables: The variables this optimizer will update.

        Raises:
          ValueError: if two variables share a name, which slots are keyed by.
        """
        if self.momentum:
            for var in variables:
                self._slot(var)

    def variable_copies(self) -> Copies:
        """The momentum slots by tower-free variable name; replicas' slots are copies.

        With `towers.Replicated`, copies "replica_1/w"... of variable "w" each have a slot;
        they are saved once under "slots/w" and restored into every copy, so optimizer state
        moves between tower counts like the weights do.

        Returns:
          "slots/<name>" -> the slot of each copy of variable <name>, the first replica's
          first.
        """
        grouped: dict[str, list] = {}
        for key, slot in self.slots.items():
            grouped.setdefault(f"slots/{canonical_name(key)}", []).append((key, slot))
        # The copy named like its group (the first replica's) comes first.
        return {
            name: tuple(s for _, s in sorted(group, key=lambda p: p[0] != name[6:]))
            for name, group in grouped.items()
        }

    def _update(self, grad, var, lr) -> tf.Operation:
        # TensorFlow's fused kernels: one op per variable, where a step has many variables.
        if self.momentum == 0.0:
            if isinstance(grad, tf.IndexedSlices):
                return var.scatter_sub(tf.IndexedSlices(grad.values * lr, grad.indices))
            return tf.raw_ops.ResourceApplyGradientDescent(var=var.handle, alpha=lr, delta=grad)
        return tf.raw_ops.ResourceApplyMomentum(
            var=var.handle,
            accum=self._slot(var).handle,
            lr=lr,
            grad=_dense(grad, var),
            momentum=tf.cast(self.momentum, var.dtype),
        )

    def _slot(self, var: tf.Variable) -> tf.Variable:
        if var.ref() not in self._slot_of:
            key = var.name.rsplit(":", 1)[0]
            if key in self.slots:
                raise ValueError(
                    f"SGD keys its momentum by variable name, and two variables are named "
                    f"{key!r}. Give them distinct names (e.g. build them in distinct name scopes)."
                )
            with tf.init_scope(), tf.device(var.device):
                slot = tf.Variable(
                    tf.zeros(var.shape, var.dtype), trainable=False, name=f"{key}/momentum"
                )
            self.slots[key] = slot
            self._slot_of[var.ref()] = slot
        return self._slot_of[var.ref()]


def _check_learning_rate(learning_rate: object) -> None:
    """A float >= 0, or a scalar floating tensor or variable (checked when it runs)."""
    if isinstance(learning_rate, (tf.Tensor, tf.Variable)):
        if learning_rate.shape.rank not in (None, 0) or not learning_rate.dtype.is_floating:
            raise TypeError(
                f"`learning_rate` must be a floating scalar; got {learning_rate.dtype.name} of "
                f"shape {learning_rate.shape}."
            )
        return
    if isinstance(learning_rate, bool) or not isinstance(learning_rate, (int, float)):
        raise TypeError(
            f"`learning_rate` must be a number, or a scalar tensor or variable; got "
            f"{learning_rate!r}."
        )
    if learning_rate < 0:
        raise ValueError(f"`learning_rate` must be >= 0; got {learning_rate}.")


def _dense(grad: tf.Tensor | tf.IndexedSlices, var: tf.Variable) -> tf.Tensor:
    """A dense gradient; slices are summed into the variable's rows (duplicates add up)."""
    if not isinstance(grad, tf.IndexedSlices):
        return grad
    rows = tf.shape(var, out_type=grad.indices.dtype)[0]
    dense = tf.math.unsorted_segment_sum(grad.values, grad.indices, rows)
    dense.set_shape(var.shape)
    return dense
