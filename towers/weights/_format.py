"""What a weights format is: an object that names, recognizes, writes, reads and removes files.

Each format is one module with one subclass of `WeightsFormat`; `towers.weights._formats`
registers them, and everything else (the weight functions, the checkpoint manager's file
names) asks the registry. A new format is a new module and a line in the registry.
"""

import abc
import contextlib
import os

import numpy as np

# What a weights file may declare in arrays: what its bytes can hold, times deflate's largest
# expansion (1032:1), plus 1 MiB. A file declaring more is a bomb or a forgery: refused before
# anything is allocated.
MAX_EXPANSION = 1032
_SLACK_BYTES = 1 << 20


def check_declared(path: str, declared: int) -> None:
    """Refuses a file whose arrays declare more bytes than it can hold.

    Args:
      path: The file read.
      declared: The bytes its arrays declare, together.

    Raises:
      ValueError: naming the file, what it declares and its size.
    """
    size = os.path.getsize(path)
    if declared > size * MAX_EXPANSION + _SLACK_BYTES:
        raise ValueError(
            f"{path!r} declares {declared} bytes of arrays in {size} bytes, more than any "
            f"weights file can hold ({MAX_EXPANSION}x its size, the most compression expands); "
            "it is refused unread."
        )


class WeightsFormat(abc.ABC):
    """One kind of weights file.

    Attributes:
      name: A short name, e.g. "npz".
      suffixes: The path suffixes that name the format, lower case; the first is the one the
        checkpoint manager writes.
      description: How error messages name it, e.g. ".npz (numpy)".
    """

    name: str = ""
    suffixes: tuple[str, ...] = ()
    description: str = ""

    def recognizes(self, path: str) -> bool:
        """Whether the file or directory at `path` holds this format, whatever its name.

        Args:
          path: An existing path.

        Returns:
          What the content says; a format that cannot tell says False.
        """
        del path
        return False

    def check_names(self, names: list[str]) -> None:
        """Refuses names this format cannot hold, beyond every format's rule (none here).

        Args:
          names: The names to write.
        """
        del names

    def check_dtypes(self, arrays: dict[str, np.ndarray]) -> None:
        """Refuses arrays whose dtype this format cannot hold exactly.

        Args:
          arrays: What is about to be written.

        Raises:
          TypeError: naming the array and a format that can hold it.
        """
        for name, array in arrays.items():
            if array.dtype.kind not in "biuf":
                raise TypeError(
                    f"Variable {name!r} is {array.dtype}, which {self.description} files cannot "
                    "hold exactly. Save to a path without suffix or ending in .ckpt (a "
                    "TensorFlow checkpoint)."
                )

    @abc.abstractmethod
    def write(self, path: str, arrays: dict[str, np.ndarray]) -> None:
        """Writes `arrays` to `path`, atomically: a crash leaves the previous file whole.

        Args:
          path: Where to write.
          arrays: Name -> array.
        """

    @abc.abstractmethod
    def read(self, path: str) -> dict[str, np.ndarray]:
        """Every array of the file at `path`, verified (a checksum, where the format has one).

        Args:
          path: An existing file or directory of this format.

        Returns:
          Name -> array.
        """

    def whole(self, path: str) -> bool:
        """Whether a write of `path` finished (files are written atomically: they exist).

        Args:
          path: The path written.

        Returns:
          Whether it is whole.
        """
        return os.path.isfile(path)

    def remove(self, path: str) -> None:
        """Removes what this format wrote at `path`, if anything.

        Args:
          path: The path written.
        """
        with contextlib.suppress(OSError):
            os.remove(path)
