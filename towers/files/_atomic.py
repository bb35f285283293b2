"""Writing files so that a crash at any moment leaves the previous version readable."""

import contextlib
import os
import re
import tempfile
from collections.abc import Callable


def as_path(path: object, argument: str = "path") -> str:
    """`path` as a str, from a str or an `os.PathLike`.

    Raises:
      TypeError: for anything else, naming the argument.
    """
    if isinstance(path, bytes) or not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"`{argument}` must be a str or os.PathLike; got {path!r}.")
    return os.fspath(path)


def atomic_write(path: str, write: Callable[[str], None]) -> None:
    """Calls `write(temp_path)`, flushes it to disk and renames it to `path`.

    The temporary file lives in the same directory (a rename never crosses file systems), so
    readers of `path` see the old file or the new one, never a part of either. Its name
    carries the writer's process id; after a successful write, the temporaries of `path`
    left by writers that no longer run (killed mid-save) are removed, never those of a live
    writer.

    Args:
      path: The file to (re)place.
      write: Writes the whole content to the path it is given.
    """
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    base = os.path.basename(path)
    fd, temp = tempfile.mkstemp(dir=directory, prefix=f".{base}.{os.getpid()}.", suffix=".tmp")
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
    remove_stale_temporaries(directory, re.escape(base))


def remove_stale_temporaries(directory: str, base_pattern: str) -> None:
    """Removes `atomic_write`'s temporaries of dead processes in `directory`.

    Only temporaries of files whose name matches `base_pattern` (a regular expression) are
    considered, and only those whose writing process no longer runs are removed.
    """
    pattern = re.compile(rf"\.(?:{base_pattern})\.(?P<writer_pid>\d+)\.\w{{8}}\.tmp")
    for name in os.listdir(directory):  # mkstemp's names: ".<base>.<pid>.<8 chars>.tmp"
        match = pattern.fullmatch(name)
        if match and not _running(int(match["writer_pid"])):
            with contextlib.suppress(OSError):
                os.remove(os.path.join(directory, name))


def _running(pid: int) -> bool:
    if pid == os.getpid():
        return True  # another thread of this process may be writing it (failures clean up)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's live process
    return True


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
