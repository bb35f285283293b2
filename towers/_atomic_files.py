"""Writing files so that a crash at any moment leaves the previous version readable."""

import contextlib
import os
import re
import tempfile
from collections.abc import Callable


def atomic_write(path: str, write: Callable[[str], None]) -> None:
    """Calls `write(temp_path)`, flushes it to disk and renames it to `path`.

    The temporary file lives in the same directory (a rename never crosses file systems), so
    readers of `path` see the old file or the new one, never a part of either. After a
    successful write, temporaries that killed writers of `path` left behind are removed: one
    writer per path at a time.

    Args:
      path: The file to (re)place.
      write: Writes the whole content to the path it is given.
    """
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    os.close(fd)
    try:
        write(temp)
        os.chmod(temp, _mode_for(path))
        fsync_path(temp)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(temp)
        raise
    fsync_path(directory)
    stale = re.compile(rf"\.{re.escape(os.path.basename(path))}\.\w{{8}}\.tmp")  # mkstemp's names
    for name in os.listdir(directory):
        if stale.fullmatch(name):
            with contextlib.suppress(OSError):
                os.remove(os.path.join(directory, name))


def _mode_for(path: str) -> int:
    """The existing file's permissions, else what a plain open() would give (mkstemp: 0600)."""
    if os.path.exists(path):
        return os.stat(path).st_mode & 0o777
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def fsync_path(path: str) -> None:
    """Flushes a file's or a directory's content to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_text(path: str, text: str) -> None:
    """`atomic_write` of a text file."""

    def write(temp: str) -> None:
        with open(temp, "w") as f:
            f.write(text)

    atomic_write(path, write)
