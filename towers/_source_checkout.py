"""Lets `towers` imported from a source checkout find `towers.ops`.

Installing places the repository's top-level `ops/` inside the package as `towers.ops`. Run
in the repository's root (`python -m towers.launch ...`), Python imports `towers/` from the
checkout instead of the installed package, and `towers/ops` does not exist there: the root is
then added to the package's search path, where `ops/` is found. Installed, nothing changes.
"""

import os
import sys

_package = sys.modules["towers"]
_here = os.path.dirname(os.path.abspath(__file__))
_root = os.path.dirname(_here)
if not os.path.isdir(os.path.join(_here, "ops")) and os.path.isfile(
    os.path.join(_root, "ops", "__init__.py")
):
    _package.__path__.append(_root)
