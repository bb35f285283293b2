"""Readable paths of the leaves of a nested structure, for error messages."""

from collections.abc import Mapping
from typing import Any

from towers.ops._tensorflow import tf


def leaf_paths(structure: Any) -> list[str]:
    """One path per leaf, in `tf.nest.flatten` order, e.g. ["['x']", "['y'][0]"].

    A structure this walk does not mirror (exotic nest types) gets "leaf #i" paths.
    """
    paths = list(_walk(structure, ""))
    if len(paths) != len(tf.nest.flatten(structure)):
        return [f"leaf #{i}" for i in range(len(tf.nest.flatten(structure)))]
    return paths


def _walk(node: Any, prefix: str):
    if isinstance(node, Mapping):
        for key in sorted(node):
            yield from _walk(node[key], f"{prefix}[{key!r}]")
    elif isinstance(node, (list, tuple)):
        for i, child in enumerate(node):
            yield from _walk(child, f"{prefix}[{i}]")
    else:
        yield prefix
