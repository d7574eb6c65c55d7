"""Where this adaptfl runs from: a source checkout (or an unpacked Flower app bundle), or an
installed wheel.

This lives in a subpackage, not in `adaptfl/__init__.py`, so that it answers the same wherever
the user stands: in the folder that contains a clone named `adaptfl`, Python takes the clone for
a namespace package `adaptfl` before it asks the editable install; `adaptfl/__init__.py` then
never runs, but `adaptfl.server_app.source` is still this file (tests/test_source.py)."""

from __future__ import annotations

from pathlib import Path

# A checkout holds this file at <root>/server_app/source.py; a wheel at
# <site-packages>/adaptfl/server_app/source.py, with no pyproject.toml beside its subpackages.
_root = Path(__file__).resolve().parent.parent
_in_checkout = (_root / "pyproject.toml").is_file() and (_root / "strategies" / "__init__.py").is_file()


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
