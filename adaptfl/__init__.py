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


def source_checkout() -> Path | None:
    """The source checkout (or unpacked Flower app) this package runs from; None when it is an
    installed wheel, which holds the modules and their data but not the Flower app itself."""
    return _root if _in_checkout else None


def checkout(needed_by: str) -> Path:
    """The source checkout, for the tools that work on it (the deployment kit, the systems
    figures: they run `flwr run` on its pyproject.toml and build images from it)."""
    if not _in_checkout:
        raise RuntimeError(f"{needed_by} works on adaptfl's source checkout (git clone it and run "
                           f"it there); this adaptfl is an installed package in {_root}")
    return _root
