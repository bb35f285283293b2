"""Finding the devices to build towers on, simulating several on one, checking them."""

from collections.abc import Iterable
from typing import Any

import tensorflow as tf

from towers.ops.internal import check_int, library_code
from towers.workers import current_workers, local_devices

KINDS = ("CPU", "GPU")


@library_code
def canonical_device(device: str | tf.DeviceSpec | tf.config.LogicalDevice) -> str:
    """The full, normalized name of a device, e.g. "/gpu:1" -> "/device:GPU:1".

    Args:
      device: A device name, a `tf.DeviceSpec` or a `tf.config.LogicalDevice`.

    Returns:
      The name as `tf.DeviceSpec` writes it.

    Raises:
      TypeError: if `device` is none of these.
      ValueError: if the name does not parse or names no device type.
    """
    if isinstance(device, tf.config.LogicalDevice):
        device = device.name
    if isinstance(device, str):
        try:
            device = tf.DeviceSpec.from_string(device)
        except ValueError as error:
            raise ValueError(f"Cannot parse device {device!r}: {error}") from None
    if not isinstance(device, tf.DeviceSpec):
        raise TypeError(
            f"A device must be a name such as '/gpu:0', a tf.DeviceSpec or a LogicalDevice; got "
            f"{device!r}."
        )
    if device.device_type is None:
        raise ValueError(
            "A tower device must name its type and index, e.g. '/gpu:0'; got "
            f"{device.to_string()!r}."
        )
    return device.to_string()


@library_code
def device_list(devices: Any, argument: str = "devices") -> list[str]:
    """Canonical names of a sequence of devices.

    A single name is refused rather than split into its characters.

    Raises:
      TypeError: if `devices` is one device or not a sequence.
      ValueError: if a name does not parse, or there is none.
    """
    if isinstance(devices, (str, bytes, tf.DeviceSpec, tf.config.LogicalDevice)):
        shown = devices.name if isinstance(devices, tf.config.LogicalDevice) else devices
        raise TypeError(
            f"`{argument}` must be a list of devices, one per tower; got the single device "
            f"{shown!r}. Pass [{shown!r}] for one tower."
        )
    try:
        names = [canonical_device(d) for d in devices]
    except TypeError:
        if isinstance(devices, Iterable):
            raise
        raise TypeError(
            f"`{argument}` must be a list of device names; got {type(devices).__name__}."
        ) from None
    if not names:
        raise ValueError(
            f"`{argument}` must name at least one device (one per tower); got none. Use "
            "towers.list_devices()."
        )
    return names


@library_code
def check_devices_exist(devices: list[str], argument: str = "devices") -> None:
    """Checks local devices against `tf.config`, where TF2 code takes them from.

    A v1 graph is run by a Session that takes its devices from its own config, so graphs built
    outside functions are not checked; the session reports a missing device when it runs.

    A device of another job or task than this process's (`towers.init_workers`) is refused
    in both: towers run on the process's own devices.

    Raises:
      ValueError: naming the missing device and those that exist.
    """
    me = current_workers()
    for device in devices:
        spec = tf.DeviceSpec.from_string(device)
        mine = spec.job in (None, "localhost") or (
            spec.job == me.job and spec.task in (None, me.index) and spec.replica in (None, 0)
        )
        if not mine:
            where = f"task {me.index} of job {me.job!r}" if me.num_workers > 1 else "alone"
            raise ValueError(
                f"Device {device!r} in `{argument}` is not this process's ({where}); towers "
                "run on the process's own devices: towers.list_devices()."
            )
    if not tf.compat.v1.executing_eagerly_outside_functions():
        return
    existing = {canonical_device(d) for d in tf.config.list_logical_devices()}
    for device in devices:
        spec = tf.DeviceSpec.from_string(device)
        local = spec.replace(job=None, replica=None, task=None).to_string()
        if spec.job in (None, "localhost") and local not in existing:
            raise ValueError(
                f"Device {device!r} in `{argument}` does not exist; this process has "
                f"{sorted(existing)}. Use towers.list_devices(), or towers.simulate_devices "
                "to make more logical devices."
            )


def _kind(kind: str) -> str:
    if not isinstance(kind, str) or kind.upper() not in KINDS:
        raise ValueError(f"`kind` must be one of {KINDS}; got {kind!r}.")
    return kind.upper()


@library_code
def list_devices(kind: str | None = None, *, num: int | None = None) -> list[str]:
    """The logical devices to build towers on: GPUs when present, otherwise CPUs.

    This initializes TensorFlow's runtime; call `simulate_devices` before it, if at all.

    Args:
      kind: "GPU" or "CPU" to choose; None takes GPUs when there are any, else CPUs.
      num: How many devices to return (the first `num`); None for all of them.

    Returns:
      Canonical device names, e.g. ["/device:GPU:0", "/device:GPU:1"].

    Raises:
      TypeError: if `num` is not an int or None.
      ValueError: if `kind` is unknown, or fewer than `num` devices of that kind exist (the
        message lists the devices that do).

    Example:
      >>> towers.simulate_devices(4)  # on a machine without GPUs, before anything else
      >>> towers.list_devices()
      ['/device:CPU:0', '/device:CPU:1', '/device:CPU:2', '/device:CPU:3']
      >>> towers.list_devices("CPU", num=2)
      ['/device:CPU:0', '/device:CPU:1']
    """
    if kind is None:
        kind = "GPU" if local_devices(tf.config.list_logical_devices("GPU")) else "CPU"
    kind = _kind(kind)
    devices = [canonical_device(d) for d in local_devices(tf.config.list_logical_devices(kind))]
    if num is None:
        return devices
    num = check_int(num, "num", minimum=1)
    if num > len(devices):
        existing = [canonical_device(d) for d in tf.config.list_logical_devices()]
        raise ValueError(
            f"Asked for {num} {kind} devices but only {len(devices)} exist: {existing}. Use "
            f"fewer towers, or call towers.simulate_devices({num}, kind={kind!r}) before "
            "TensorFlow initializes to split one device into several."
        )
    return devices[:num]


@library_code
def simulate_devices(num: int, kind: str = "CPU", *, memory_limit_mb: int | None = None) -> None:
    """Splits the first physical device of `kind` into `num` logical devices.

    Call it once per process before TensorFlow initializes its runtime (before any op runs or
    `list_devices` is called). Calling it again with the same `num` does nothing.

    Args:
      num: The number of logical devices to make, >= 1.
      kind: "CPU" (the default; how tests and CPU-only machines get several towers) or "GPU".
      memory_limit_mb: Memory of each logical GPU in MiB; required for GPUs, which need a
        limit to be split.

    Raises:
      TypeError: if `num` is not an int.
      ValueError: if `num` < 1, `kind` is unknown, a GPU split lacks `memory_limit_mb`, or no
        physical device of `kind` exists.
      RuntimeError: if TensorFlow is already initialized with another number of devices.

    Example:
      >>> towers.simulate_devices(4)  # first thing in main()
      >>> towers.list_devices()
      ['/device:CPU:0', '/device:CPU:1', '/device:CPU:2', '/device:CPU:3']
    """
    num = check_int(num, "num", minimum=1)
    kind = _kind(kind)
    if kind == "GPU" and memory_limit_mb is None:
        raise ValueError(
            "Splitting a GPU needs `memory_limit_mb`, the memory of each logical GPU; e.g. "
            "simulate_devices(2, 'GPU', memory_limit_mb=4096)."
        )
    physical = tf.config.list_physical_devices(kind)
    if not physical:
        found = [d.name for d in tf.config.list_physical_devices()]
        raise ValueError(f"No physical {kind} device to split; this machine has {found}.")
    current = tf.config.get_logical_device_configuration(physical[0])
    if len(current or [None]) == num:
        return
    config = [tf.config.LogicalDeviceConfiguration(memory_limit=memory_limit_mb)] * num
    try:
        tf.config.set_logical_device_configuration(physical[0], config)
    except RuntimeError:
        raise RuntimeError(
            f"Cannot simulate {num} {kind} devices: TensorFlow is already initialized with "
            f"{len(current or [None])} logical {kind} device(s). Call towers.simulate_devices "
            "first thing in the process, before any op runs or devices are listed."
        ) from None


@library_code
def session_config(num_cpus: int | None = None) -> tf.compat.v1.ConfigProto:
    """A `tf.compat.v1.ConfigProto` whose sessions have the logical devices towers use.

    A v1 `Session` makes its devices from its own config, not from `tf.config`: CPUs from
    `device_count`, GPUs from `gpu_options`. Pass this config to every session that runs tower
    graphs so that `/cpu:1`... and the logical GPUs of `simulate_devices(..., "GPU")` exist
    there too, and the GPUs `tf.config.set_visible_devices` hid stay hidden. Soft placement
    stays off: an op pinned to a missing device (or to a GPU without a kernel for it) is an
    error, not a silent move. After `init_workers`, the session sees this worker's devices
    only; open it on the worker's server:
    `tf.compat.v1.Session(worker.target, config=towers.session_config())`.

    Args:
      num_cpus: CPU devices the session should have; None for as many as `tf.config` has
        (`simulate_devices` included).

    Returns:
      The config, to pass as `tf.compat.v1.Session(config=...)`.

    Raises:
      TypeError: if `num_cpus` is not an int or None.
      ValueError: if `num_cpus` < 1.

    Example:
      >>> towers.simulate_devices(4)
      >>> with tf.compat.v1.Session(graph=graph, config=towers.session_config()) as sess:
      ...     sess.run(train_op)
    """
    if num_cpus is None:
        num_cpus = len(local_devices(tf.config.list_logical_devices("CPU")))
    num_cpus = check_int(num_cpus, "num_cpus", minimum=1)
    config = tf.compat.v1.ConfigProto(device_count={"CPU": num_cpus}, allow_soft_placement=False)
    _same_gpus(config.gpu_options, config.device_count)
    info = current_workers()
    if info.num_workers > 1:  # the session (on `info.target`) sees this worker's devices only
        config.device_filters.append(f"/job:{info.job}/task:{info.index}")
    return config


def _same_gpus(options: Any, device_count: Any) -> None:
    """Gives a session's `gpu_options` the visible GPUs and logical splits of `tf.config`."""
    physical = tf.config.list_physical_devices("GPU")
    visible = [gpu for gpu in tf.config.get_visible_devices("GPU") if gpu in physical]
    if not visible:
        if physical:
            device_count["GPU"] = 0
        return
    options.visible_device_list = ",".join(str(physical.index(gpu)) for gpu in visible)
    splits = [tf.config.get_logical_device_configuration(gpu) for gpu in visible]
    if not any(splits):
        return
    for split in splits:  # one entry per visible GPU; an empty one is the whole GPU
        entry = options.experimental.virtual_devices.add()
        for logical in split or []:
            entry.memory_limit_mb.append(logical.memory_limit)
            if logical.experimental_priority is not None:
                entry.priority.append(logical.experimental_priority)
            if logical.experimental_device_ordinal is not None:
                entry.device_ordinal.append(logical.experimental_device_ordinal)
