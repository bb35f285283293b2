"""Lets `towers` imported from a source checkout find `towers.ops`.

Installing places the repository's top-level `ops/` inside the package as `towers.ops`. Run
in the repository's root (`python -m towers.launch ...`), Python imports `towers/` from the
checkout instead of the installed package, and `towers/ops` does not exist there. Only then
(no finder knows `towers.ops`, and the checkout's `ops/` is ours) is that directory loaded as
`towers.ops`; nothing else of the root becomes part of the package. Installed, editable or
not, nothing happens.
"""

import importlib.util
import os
import sys

_package = sys.modules["towers"]
_ops = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ops")
_ours = os.path.isfile(os.path.join(_ops, "_all_reduce_gradients.py"))
if _ours and importlib.util.find_spec("towers.ops") is None:
    _spec = importlib.util.spec_from_file_location(
        "towers.ops", os.path.join(_ops, "__init__.py"), submodule_search_locations=[_ops]
    )
    _module = importlib.util.module_from_spec(_spec)
    sys.modules["towers.ops"] = _module
    try:
        _spec.loader.exec_module(_module)
    except BaseException:
        del sys.modules["towers.ops"]  # no half-imported module left behind
        raise
    _package.ops = _module
