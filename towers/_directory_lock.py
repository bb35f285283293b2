"""One writer per directory: an exclusive OS lock on a file, released when its holder ends."""

import fcntl
import os
import socket
import time


class DirectoryLock:
    """An exclusive `flock` on `directory/name`, held until `release()` or the process ends.

    The lock file records its holder (process id, host, time) for the error a second writer
    gets. The operating system drops the lock when the holder's file is closed, also when the
    process is killed, so a crash never leaves a directory locked.

    Args:
      directory: The directory to lock; created if needed.
      name: The lock file's name in it.

    Raises:
      RuntimeError: if another holder (in this or another process) has the lock.
    """

    def __init__(self, directory: str, name: str):
        os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(directory, name)
        self._file = open(self.path, "a+")  # noqa: SIM115  (held open: the lock lives with it)
        try:
            fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._file.seek(0)
            holder = self._file.read().strip() or "another process"
            self._file.close()
            raise RuntimeError(
                f"{directory!r} is being written by another CheckpointManager ({holder}); one "
                "writer per directory. Stop that one (or close() it), or use another directory."
            ) from None
        self._file.seek(0)
        self._file.truncate()
        since = time.strftime("%Y-%m-%d %H:%M:%S")
        self._file.write(f"pid {os.getpid()} on {socket.gethostname()} since {since}")
        self._file.flush()

    @property
    def held(self) -> bool:
        """Whether this object still holds the lock."""
        return not self._file.closed

    def release(self) -> None:
        """Releases the lock (closing its file); doing it twice is harmless."""
        if not self._file.closed:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()
