"""Hierarchical all-reduce: sum within groups of devices, all-reduce across their leaders."""

from towers.ops._all_reduce.base import AllReduce
from towers.ops._all_reduce.flat import flat_algorithm
from towers.ops._all_reduce.transfers import spread, sum_on
from towers.ops._arguments import check_int
from towers.ops._tensorflow import tf


class HierarchicalAllReduce(AllReduce):
    """Sums within groups of devices, all-reduces the group sums, copies them back.

    For machines whose devices form groups with fast links inside and slower ones between
    (GPUs behind two PCIe switches, or NVLink quads): devices `[0, g)`, `[g, 2g)`, ... form
    groups of `devices_per_group` = g. Each group's first device (its leader) adds the group's
    values; the leaders all-reduce those sums with `across`; each leader copies the total to
    its group. Only one value per group crosses between groups, twice.

    Results are bitwise equal on every device: each group's total is a copy of its leader's,
    and `across` gives every leader the same sum.

    Args:
      devices_per_group: Devices per group; None for two groups (the first half of the
        devices, and the rest), as on machines of two switches or sockets.
      across: The all-reduce among the group leaders: the name of a built-in flat algorithm
        ("ring", the default, "reduce_broadcast", "collective", "nccl", "auto") or an
        `ops.AllReduce`.

    Raises:
      ValueError: if `devices_per_group` is not a positive int, or `across` is unknown or
        reaches beyond this process.
      TypeError: if `across` is neither a name nor an `ops.AllReduce`.
    """

    name = "hierarchical"

    def __init__(self, devices_per_group: int | None = None, across: str | AllReduce = "ring"):
        self.devices_per_group = check_int(
            devices_per_group, "devices_per_group", minimum=1, none=True
        )
        self.across = flat_algorithm(across, "across")
        if self.across.group_size(2) != 2:
            raise ValueError(
                f"`across` must reduce among this process's group leaders only; "
                f"{type(self.across).__name__} reaches other processes (give it to "
                "all_reduce_gradients or Replicated itself)."
            )

    def groups(self, devices: list[str]) -> list[list[int]]:
        """The groups of device indices this instance reduces `devices` in.

        Args:
          devices: The devices of one all-reduce, in order.

        Returns:
          Lists of indices into `devices`; the first index of each is the group's leader.
        """
        size = self.devices_per_group or max(1, -(-len(devices) // 2))
        return [list(range(i, min(i + size, len(devices)))) for i in range(0, len(devices), size)]

    def sum(
        self, values: list[tf.Tensor], devices: list[str], wire_dtype: tf.DType | None
    ) -> list[tf.Tensor]:
        """Group sums on the leaders, `across` among them, copies back; see `AllReduce.sum`."""
        groups = self.groups(devices)
        leaders = [devices[group[0]] for group in groups]
        partial = [
            sum_on(leader, [values[i] for i in group], [devices[i] for i in group], wire_dtype)
            for leader, group in zip(leaders, groups)
        ]
        if len(groups) > 1:
            partial = self.across(partial, leaders, wire_dtype=wire_dtype)
        out = [None] * len(devices)
        for leader, group, total in zip(leaders, groups, partial):
            members = [devices[i] for i in group]
            for i, copy in zip(group, spread(total, leader, members, values[0].dtype, wire_dtype)):
                out[i] = copy
        return out
