"""adaptfl: federated adaptive and second-order optimization on Flower.

The subpackages live in the repository's top-level folders (`strategies/`, `client_app/`, …) and
are installed under this one namespace (`adaptfl.strategies`, `adaptfl.client_app`, …) by the
`package-dir` mapping in `pyproject.toml`.
"""

from __future__ import annotations

from pathlib import Path

__version__ = "0.2.0"

# A source checkout, or a Flower app bundle (FAB) unpacked by a SuperLink/SuperNode, holds this
# file at <root>/adaptfl/__init__.py and the subpackages at <root>/<name>/. Python then finds
# this package first on sys.path, so look for the subpackages at <root> too. An installed wheel
# has them inside this folder and no pyproject.toml beside it, so nothing is added there.
_root = Path(__file__).resolve().parent.parent
_in_checkout = (_root / "pyproject.toml").is_file() and (_root / "strategies" / "__init__.py").is_file()
if _in_checkout:
    __path__.append(str(_root))  # noqa: F821 - `__path__` is defined for packages

# Where adaptfl runs from. adaptfl's own modules import these from `adaptfl.server_app.source`,
# which also answers when this file never runs (a clone named `adaptfl` in the current folder
# is a namespace package to Python; see there).
from adaptfl.server_app.source import checkout, source_checkout  # noqa: E402

__all__ = ["__version__", "checkout", "source_checkout"]
