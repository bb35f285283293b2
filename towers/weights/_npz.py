"""The `.npz` weights format: a zip of `.npy` members, one per name, CRC-32 checked on read."""

import zipfile

import numpy as np

from towers.files import atomic_write
from towers.weights._format import WeightsFormat, check_declared

_MAGIC = b"PK\x03\x04"


class Npz(WeightsFormat):
    """numpy's `.npz`: readable by `np.load` alone; each member carries its zip CRC-32."""

    name = "npz"
    suffixes = (".npz",)
    description = ".npz (numpy)"

    def recognizes(self, path: str) -> bool:
        """See `WeightsFormat.recognizes`: a zip archive's first bytes."""
        with open(path, "rb") as f:
            return f.read(len(_MAGIC)) == _MAGIC

    def write(self, path: str, arrays: dict[str, np.ndarray]) -> None:
        """See `WeightsFormat.write`."""
        atomic_write(path, lambda temp: _write(temp, arrays))

    def read(self, path: str) -> dict[str, np.ndarray]:
        """See `WeightsFormat.read`: reading a member whole checks its CRC-32.

        Each member's header is read first: an array declaring more than its member holds,
        or members declaring more than the file can hold, are refused before allocating.
        """
        with zipfile.ZipFile(path) as archive:
            declared = sum(_declared(archive, info) for info in archive.infolist())
        check_declared(path, declared)
        with np.load(path, allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
        for name, array in arrays.items():
            if not isinstance(array, np.ndarray):  # np.load returns raw bytes for a non-array
                raise ValueError(f"member {name!r} is not an array")
        return arrays


def _write(path: str, arrays: dict[str, np.ndarray]) -> None:
    # Written member by member (not np.savez(**arrays)): names like "file" stay names.
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, array in arrays.items():
            with archive.open(name + ".npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asarray(array), allow_pickle=False)


def _declared(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> int:
    """The bytes the `.npy` member `info` declares, checked against what the member holds."""
    with archive.open(info) as member:
        version = np.lib.format.read_magic(member)
        header = {(1, 0): np.lib.format.read_array_header_1_0}.get(
            version, np.lib.format.read_array_header_2_0
        )
        shape, _, dtype = header(member, max_header_size=1 << 16)
    declared = int(np.prod(shape, dtype=np.float64)) * dtype.itemsize
    if declared > info.file_size:
        raise ValueError(
            f"member {info.filename!r} declares {shape} {dtype} ({declared} bytes) in "
            f"{info.file_size} bytes"
        )
    return declared
