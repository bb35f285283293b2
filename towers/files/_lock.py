"""One writer per directory: an exclusive OS lock on a file, released when its holder ends."""

import errno
import fcntl
import os
import socket
import stat
import time


class DirectoryLock:
    """An exclusive `flock` on `directory/name`, held until `release()` or the process ends.

    The lock file records its holder (process id, host, time) for the error a second writer
    gets. The operating system drops the lock when the holder's file is closed, also when the
    process is killed, so a crash never leaves a directory locked.

    Args:
      directory: The directory to lock; created if needed.
      name: The lock file's name in it.
      wait_seconds: How long to wait for another holder to release it; 0 to fail at once.
      holder: What the error calls the holder ("another CheckpointManager", ...).

    Raises:
      RuntimeError: if another holder (in this or another process) keeps the lock.
      PermissionError: if the directory cannot be written.
      ValueError: if the lock file is a symbolic link or not a regular file.
    """

    def __init__(
        self, directory: str, name: str, wait_seconds: float = 0.0, holder: str = "another writer"
    ):
        os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(directory, name)
        try:  # never through a link: the lock file is written, a link's target is not ours
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except PermissionError:
            raise PermissionError(
                f"Cannot write to {directory!r} (no permission to create {name!r}); towers "
                "writes only to directories it may write."
            ) from None
        except OSError as error:
            if error.errno != errno.ELOOP:
                raise
            raise ValueError(
                f"{self.path!r} is a symbolic link; towers writes its lock file itself and "
                "never through a link. Remove the link."
            ) from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise ValueError(f"{self.path!r} is not a regular file; remove it.")
        self._file = os.fdopen(fd, "r+")
        deadline = time.monotonic() + wait_seconds
        while not self._try_lock():
            if time.monotonic() >= deadline:
                self._file.seek(0)
                found = self._file.read().strip() or "another process"
                self._file.close()
                raise RuntimeError(
                    f"{directory!r} is being written by {holder} ({found}); one writer per "
                    "directory. Stop that one (or close() it), or use another directory."
                )
            time.sleep(0.05)
        self._file.seek(0)
        self._file.truncate()
        since = time.strftime("%Y-%m-%d %H:%M:%S")
        self._file.write(f"pid {os.getpid()} on {socket.gethostname()} since {since}")
        self._file.flush()

    def _try_lock(self) -> bool:
        try:
            fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        return True

    @property
    def held(self) -> bool:
        """Whether this object still holds the lock."""
        return not self._file.closed

    def release(self) -> None:
        """Releases the lock (closing its file); doing it twice is harmless."""
        if not self._file.closed:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
