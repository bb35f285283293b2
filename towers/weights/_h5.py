"""The HDF5 weights format (`.h5`, `.hdf5`): one dataset per name, with a CRC-32 attribute."""

import zlib

import numpy as np

from towers.files import atomic_write
from towers.weights._format import WeightsFormat, check_declared

_MAGIC = b"\x89HDF\r\n\x1a\n"
_CRC = "towers_crc32"  # the attribute of a dataset holding its name's and data's CRC-32


class H5(WeightsFormat):
    """HDF5 through h5py: a dataset per name (a name's "/" parts are groups)."""

    name = "h5"
    suffixes = (".h5", ".hdf5")
    description = ".h5 or .hdf5 (HDF5)"

    def recognizes(self, path: str) -> bool:
        """See `WeightsFormat.recognizes`: HDF5's signature at the start of the file."""
        with open(path, "rb") as f:
            return f.read(len(_MAGIC)) == _MAGIC

    def check_names(self, names: list[str]) -> None:
        """Refuses a name and a name inside it: a dataset cannot also be a group.

        Raises:
          ValueError: naming every such pair.
        """
        taken = set(names)
        nested = sorted(
            f"{prefix!r} and {name!r}"
            for name in names
            for prefix in _parents(name)
            if prefix in taken
        )
        if nested:
            raise ValueError(
                f"An .h5 file cannot hold a name and a name inside it (a dataset is not a "
                f"group): {', '.join(nested)}. Rename them, or save to .npz or a checkpoint."
            )

    def write(self, path: str, arrays: dict[str, np.ndarray]) -> None:
        """See `WeightsFormat.write`."""
        h5py = _h5py()

        def write(temp: str) -> None:
            with h5py.File(temp, "w") as f:
                for name, array in arrays.items():
                    dataset = f.create_dataset(name, data=array)
                    dataset.attrs[_CRC] = np.uint32(_crc32(name, array))

        atomic_write(path, write)

    def read(self, path: str) -> dict[str, np.ndarray]:
        """See `WeightsFormat.read`: a dataset written here must match its checksum.

        The file is untrusted: external links, external raw storage and virtual datasets
        (which would read other files) are refused, and so are datasets declaring more than
        the file can hold, all before any data is read.
        """
        h5py = _h5py()
        datasets = {}

        external = []  # (raising inside h5py's link visitor is a SystemError)

        def visit_link(name, link):
            if isinstance(link, h5py.ExternalLink):
                external.append(f"{name!r} -> {link.filename!r}")

        def visit(name, node):
            if isinstance(node, h5py.Dataset):
                if node.is_virtual or node.external:
                    raise ValueError(f"dataset {name!r} reads its data from other files")
                datasets[name] = node

        found = {}
        with h5py.File(path, "r") as f:
            f.visititems_links(visit_link)
            if external:
                raise ValueError(f"links to other files: {', '.join(external)}")
            f.visititems(visit)
            check_declared(path, sum(node.size * node.dtype.itemsize for node in datasets.values()))
            for name, node in datasets.items():
                array = np.asarray(node[()])
                if _CRC in node.attrs and int(node.attrs[_CRC]) != _crc32(name, array):
                    raise ValueError(f"the checksum of {name!r} does not match its data")
                found[name] = array
        return found


def _parents(name: str) -> list[str]:
    parts = name.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def _crc32(name: str, array: np.ndarray) -> int:
    """The CRC-32 of a dataset's name and data: a flipped bit in either is noticed."""
    return zlib.crc32(np.ascontiguousarray(array).tobytes(), zlib.crc32(name.encode()))


def _h5py():
    try:
        import h5py
    except ModuleNotFoundError:
        raise ImportError("`.h5` weight files need h5py: `pip install h5py`.") from None
    return h5py
