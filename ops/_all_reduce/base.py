"""The all-reduce contract: K values on K devices in, K equal sums (or means) out."""

import abc
from collections.abc import Sequence

from towers.ops._all_reduce import checks, parts
from towers.ops._all_reduce.terms import terms_of
from towers.ops._autograph import library_code
from towers.ops._tensorflow import tf


class AllReduce(abc.ABC):
    """Base of every all-reduce algorithm: one call contract, one method to implement.

    Call an algorithm as `algorithm(values, devices, reduction="sum", wire_dtype=None)`:
    `values[i]` lives on `devices[i]`; the result is K tensors, result i on `devices[i]`, all
    equal to the sum (or mean) of the values. With `wire_dtype` (float16 or bfloat16) values
    cross devices in that dtype. The base class validates the arguments, handles K=1 and the
    mean; an algorithm implements only `sum`.

    A custom algorithm subclasses `AllReduce` and implements `sum`; it can then be given
    anywhere an algorithm is accepted (`ops.all_reduce_gradients(algorithm=...)`,
    `towers.Replicated(all_reduce=...)`):

        class AddEverywhere(ops.AllReduce):
            name = "add_everywhere"

            def sum(self, values, devices, wire_dtype):
                out = []
                for device in devices:
                    with tf.device(device):
                        out.append(tf.add_n([tf.identity(v) for v in values]))
                return out

    Attributes:
      name: The algorithm's name, as in `ops.ALGORITHMS` for the built-in ones.
    """

    name = "base"

    @library_code
    def __call__(
        self,
        values: Sequence[tf.Tensor],
        devices: Sequence[str],
        *,
        reduction: str = "sum",
        wire_dtype: tf.DType | None = None,
    ) -> list[tf.Tensor]:
        """All-reduces `values`; see the class docstring.

        Args:
          values: K tensors of one shape and dtype, `values[i]` on `devices[i]`.
          devices: The K devices.
          reduction: "sum" or "mean".
          wire_dtype: None, tf.float16 or tf.bfloat16: the dtype values cross devices in.

        Returns:
          K tensors, result i built on `devices[i]`.

        Raises:
          ValueError: if values and devices differ in number, values differ in static shape
            or dtype, or `reduction` or `wire_dtype` is unknown, or `wire_dtype` is given for
            values that are not floating-point.
          TypeError: for values that are not numbers (strings, booleans), or the mean of
            integers (inexact: sum them, and divide as floats).
          tf.errors.InvalidArgumentError: when the step runs, if shapes known only then
            differ.
        """
        values, devices = checks.checked(values, devices, reduction, wire_dtype)
        if self.group_size(len(values)) == 1:
            with tf.device(devices[0]):
                return [tf.identity(values[0])]
        summed = self.sum(values, devices, wire_dtype)
        return (
            summed if reduction == "sum" else _means(summed, devices, self.group_size(len(values)))
        )

    @library_code
    def sum_terms(
        self,
        values: Sequence[tf.Tensor],
        devices: Sequence[str],
        *,
        wire_dtype: tf.DType | None = None,
    ) -> list[list[tf.Tensor]]:
        """Each device's terms of the sum, to add in order where the sum is used.

        `terms[i]` added in order is the sum on `devices[i]`, bitwise equal everywhere: each
        device's sum alone, or (`GatherAddAllReduce`, two devices) both values, which a
        compiled program reading the sum (a compiled update) adds as it reads them.

        Args:
          values: K tensors of one shape and dtype, `values[i]` on `devices[i]`.
          devices: The K devices.
          wire_dtype: As in `__call__` (whose errors it raises).

        Returns:
          K lists of tensors, list i on `devices[i]`.
        """
        values, devices = checks.checked(values, devices, "sum", wire_dtype)
        if self.group_size(len(values)) == 1:
            with tf.device(devices[0]):
                return [[tf.identity(values[0])]]
        return terms_of(self, values, devices, wire_dtype)

    @library_code
    def reduce_scatter(
        self,
        values: Sequence[tf.Tensor],
        devices: Sequence[str],
        *,
        sizes: Sequence[int] | None = None,
        reduction: str = "sum",
        wire_dtype: tf.DType | None = None,
    ) -> list[tf.Tensor]:
        """Each device's part of the sum (or mean): the all-reduce's first half.

        The values (shape [N, ...]) are cut along their first axis into one part per device
        of the group, `sizes[r]` rows for the device of rank r (this process's devices are
        ranks `group_rank(K)` on); result i is part `group_rank(K) + i` of the sum, on
        `devices[i]`. See `all_gather` for the other half.

        Args:
          values: K tensors of one shape (static first axis) and dtype, on `devices`.
          devices: The K devices.
          sizes: The rows of each device's part, one int per device of the group, summing
            to N; default as even as `ops.split_batch` cuts (sizes differ by at most one).
          reduction: "sum" or "mean".
          wire_dtype: None, tf.float16 or tf.bfloat16: the dtype values cross devices in.

        Returns:
          K tensors, result i on `devices[i]` with `sizes[group_rank(K) + i]` rows.

        Raises:
          ValueError: as `__call__`, or if `sizes` is not one int >= 0 per device of the
            group summing to N, or the first axis is not static.
          TypeError: as `__call__`.
        """
        values, devices = [tf.convert_to_tensor(v) for v in values], list(devices)
        checks.check(values, devices, reduction, wire_dtype)
        group = self.group_size(len(values))
        total = parts.first_dimension(values, "reduce_scatter")
        sizes = parts.checked_sizes(sizes, total, group, "values' first dimension")
        values = checks.same_shapes_at_run_time(values, devices)
        if group == 1:
            with tf.device(devices[0]):
                return [tf.identity(values[0])]
        summed = self.scatter_sum(values, devices, sizes, wire_dtype)
        return summed if reduction == "sum" else _means(summed, devices, group)

    @library_code
    def all_gather(
        self,
        values: Sequence[tf.Tensor],
        devices: Sequence[str],
        *,
        sizes: Sequence[int] | None = None,
    ) -> list[tf.Tensor]:
        """Every device's part, concatenated in the group's order, on every device.

        The all-reduce's second half: `all_gather(reduce_scatter(v, d, sizes=s), d,
        sizes=s)` is `all_reduce(v, d)`. Result i on `devices[i]`, bitwise equal everywhere.

        Args:
          values: K parts, part i on `devices[i]`: `sizes[group_rank(K) + i]` rows, the
            same dtype and trailing shape.
          devices: The K devices.
          sizes: The rows of each device's part, one int per device of the group; default
            (a group of these devices only) the parts' own.

        Returns:
          K tensors of `sum(sizes)` rows, result i on `devices[i]`.

        Raises:
          ValueError: if the parts do not agree with `sizes` or with each other, or the group
            reaches beyond `devices` and `sizes` is not given.
          TypeError: for parts that are not numbers.
        """
        values, devices = [tf.convert_to_tensor(v) for v in values], list(devices)
        group, rank = self.group_size(len(values)), self.group_rank(len(values))
        if sizes is None:
            if group != len(values):
                raise ValueError(
                    "all_gather across a group beyond these devices needs `sizes`: every "
                    "device's rows, other processes' included."
                )
            sizes = [parts.first_dimension([v], "all_gather") for v in values]
        sizes = parts.checked_sizes(sizes, None, group, "gathered rows")
        parts.check_parts(values, devices, sizes, rank)
        checks.check(values, devices, "sum", None, shapes=False)  # (their rows differ)
        if group == 1:
            with tf.device(devices[0]):
                return [tf.identity(values[0])]
        return self.gather_parts(values, devices, sizes)

    def scatter_sum(
        self,
        values: list[tf.Tensor],
        devices: list[str],
        sizes: list[int],
        wire_dtype: tf.DType | None,
    ) -> list[tf.Tensor]:
        """The extension point of `reduce_scatter` (checked arguments, a group of 2 or more).

        The default keeps each device's part of the whole sum (`sum`); an algorithm that
        can send less overrides it.

        Args:
          values: The K values.
          devices: Their devices.
          sizes: Every device's part's rows, in the group's order.
          wire_dtype: As in `sum`.

        Returns:
          Part `group_rank(K) + i` of the sum on `devices[i]`, for each i.
        """
        whole = self.sum(values, devices, wire_dtype)
        return parts.sliced(whole, devices, sizes, self.group_rank(len(values)))

    def gather_parts(
        self, values: list[tf.Tensor], devices: list[str], sizes: list[int]
    ) -> list[tf.Tensor]:
        """The extension point of `all_gather` (checked arguments, a group of 2 or more).

        The default sums each part padded with zeros to the whole (adding zeros is exact);
        an algorithm that can copy the parts overrides it.

        Args:
          values: The K parts.
          devices: Their devices.
          sizes: Every device's part's rows, in the group's order.

        Returns:
          The whole on each device, bitwise equal everywhere.
        """
        rank = self.group_rank(len(values))
        return self.sum(parts.padded(values, devices, sizes, rank), devices, None)

    def group_rank(self, num_values: int) -> int:
        """The rank in the group of this process's first value.

        0 unless the group spans other processes, whose devices may come first.

        Args:
          num_values: The number of values given, one per device.

        Returns:
          The rank of `values[0]`'s device among the group's devices.
        """
        del num_values
        return 0

    def group_size(self, num_values: int) -> int:
        """How many values one all-reduce of `num_values` local values adds up.

        `num_values` itself, unless the group reaches beyond this process's devices (another
        process's towers): the mean divides by it, and a group of one is its own sum.

        Args:
          num_values: The number of values given, one per device.

        Returns:
          The number of values in the sum.
        """
        return num_values

    @abc.abstractmethod
    def sum(
        self, values: list[tf.Tensor], devices: list[str], wire_dtype: tf.DType | None
    ) -> list[tf.Tensor]:
        """The extension point: returns the sum of `values` on each of `devices`.

        Called by `__call__` after validation, with K >= 2 values of one shape and dtype,
        `values[i]` on `devices[i]`.

        Args:
          values: The K tensors to add.
          devices: Their K devices.
          wire_dtype: None, or the dtype (float16 or bfloat16) to cast values to before they
            cross devices; cast results back to the values' dtype.

        Returns:
          K tensors of the values' shape and dtype, tensor i built on `devices[i]`. They must
          be bitwise equal (compute each sum once and copy it, or add in the same order on
          every device) so that replicated variables updated with them stay identical.
        """


def _means(summed: list[tf.Tensor], devices: list[str], group: int) -> list[tf.Tensor]:
    """Each sum divided by the group's size, on its device."""
    out = []
    for value, device in zip(summed, devices):
        with tf.device(device):
            out.append(value / tf.cast(group, value.dtype))
    return out
