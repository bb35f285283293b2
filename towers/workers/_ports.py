"""Ports for local workers that no other process's outgoing connection can take first.

A port the kernel hands out (`bind(("", 0))`) lies in its ephemeral range, which every
outgoing connection on the machine draws from; a port below that range is taken only by a
process that binds it on purpose. Imports nothing of the package (`python launch.py` runs
without TensorFlow).
"""

import random

LOWEST_PORT = 10000  # (below: well-known and registered services' ports)


def below_ephemeral(tries: int = 64) -> list[int]:
    """Up to `tries` random ports from `LOWEST_PORT` to below the kernel's ephemeral range.

    Args:
      tries: How many candidates.

    Returns:
      Distinct port numbers, not checked free; [] where the range is unknown (not Linux)
      or leaves fewer than `tries` ports below it.
    """
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return []
    if low - LOWEST_PORT < tries:
        return []
    return random.SystemRandom().sample(range(LOWEST_PORT, low), tries)
