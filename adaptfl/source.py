"""Where this adaptfl runs from: a source checkout (or a Flower app bundle unpacked by a SuperLink
or SuperNode), or an installed wheel. The one place that asks; the deployment kit and the
systems figures need the checkout (they run `flwr run` on its pyproject.toml, build images)."""

from __future__ import annotations

from pathlib import Path

# A checkout (and a FAB) holds this file at <root>/adaptfl/source.py beside <root>/pyproject.toml;
# a wheel at <site-packages>/adaptfl/source.py, with no pyproject.toml one level up.
_root = Path(__file__).resolve().parent.parent
_in_checkout = (_root / "pyproject.toml").is_file() and (_root / "adaptfl" / "source.py").is_file()


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
