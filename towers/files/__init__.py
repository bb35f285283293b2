"""Files that a crash or a second writer cannot corrupt: atomic writes, a directory lock.

Used by the weight formats and the checkpoint manager; nothing here knows either.
"""

from towers.files._atomic import (
    as_path,
    atomic_write,
    atomic_write_text,
    fsync_path,
    remove_stale_temporaries,
)
from towers.files._lock import DirectoryLock

__all__ = [
    "DirectoryLock",
    "as_path",
    "atomic_write",
    "atomic_write_text",
    "fsync_path",
    "remove_stale_temporaries",
]
