"""Weight files: save, restore and read plain weights in any registered format.

Names are tower-free (`towers.variables`), so any single-device program loads them. A format
is a `WeightsFormat` object in the registry `FORMATS` (`.npz`, `.h5`, TensorFlow checkpoint
directories); each verifies its data when read.
"""

from towers.weights._format import WeightsFormat
from towers.weights._formats import (
    FORMATS,
    read_arrays,
    remove,
    whole,
    write_arrays,
    written_suffix,
    written_suffixes,
)
from towers.weights._io import (
    RestoreReport,
    assign_arrays,
    match_arrays,
    read_weights,
    restore_weights,
    save_weights,
    values_of,
)

__all__ = [
    "FORMATS",
    "WeightsFormat",
    "remove",
    "whole",
    "written_suffix",
    "written_suffixes",
    "RestoreReport",
    "assign_arrays",
    "match_arrays",
    "read_arrays",
    "read_weights",
    "restore_weights",
    "save_weights",
    "values_of",
    "write_arrays",
]
