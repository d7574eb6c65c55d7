"""`python -m adaptfl.new <folder> [--algorithm fedact]`: a complete, runnable Flower app on adaptfl.

As `flwr new` does for Flower: a pyproject.toml (`[tool.flwr.app]` with its components and the
run-config keys the app sets), a package with `server_app.py`, `client_app.py` and `task.py` (the
data and model the user edits; a small synthetic problem, so it runs offline) and a README with
the two commands. The files are adaptfl/templates/app/*.tmpl: `string.Template` text, not
importable Python, so the placeholders never meet ruff, mypy or the FAB (whose include rules
name .py/.toml/.md/.yml only); the generated files are checked by tests/project/test_template.py.
No `[tool.flwr.federations]`: Flower 1.42 moves that section into its own config.toml (the local
simulation is the default connection), so the app's pyproject has none, as examples/ have none.
"""

from __future__ import annotations

import argparse
import importlib.util
import keyword
import re
import sys
from importlib import metadata, resources
from importlib.resources.abc import Traversable
from pathlib import Path
from string import Template

TEMPLATE = "templates/app"
SUFFIX = ".tmpl"
PACKAGE_FOLDER = "package"  # renamed to the app's package name
DOTFILES = {"gitignore": ".gitignore"}  # stored without the dot: package-data globs skip dotfiles
MAX_PROJECT_NAME = 32  # Flower's limit on an app's name (it starts with a letter; letters, digits, -)


def default_names(folder: Path) -> tuple[str, str]:
    """The project name and the package name from the folder's name: `My App` -> my-app, my_app."""
    words = re.findall(r"[a-z0-9]+", folder.resolve().name.lower()) or ["my", "app"]
    if words[0][0].isdigit():
        words.insert(0, "app")
    project = "-".join(words)[:MAX_PROJECT_NAME].rstrip("-")
    return project, "_".join(words)


def check_package(package: str) -> str | None:
    """Why `package` cannot be the app's package name, or None."""
    if not package.isidentifier() or keyword.iskeyword(package):
        return f"package name {package!r} is not a Python identifier"
    if package in ("adaptfl", "flwr", "torch") or package in sys.stdlib_module_names:
        return f"package name {package!r} would shadow an installed package: pass --package NAME"
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    if spec is not None:  # Flower's managed SuperLink keeps an app's folder on the import path: a
        # second app of the same package name would import the first one's code (docs/own-app.md)
        where = spec.origin or ", ".join(spec.submodule_search_locations or []) or "?"
        return (f"package name {package!r} is already importable here ({where}): two apps of one "
                "package name import each other's code; pass --package NAME")
    return None


def _version() -> str:
    try:
        return metadata.version("adaptfl")
    except metadata.PackageNotFoundError:
        return "0.2"


def template_files() -> list[tuple[str, str]]:
    """(relative path with the .tmpl suffix dropped, text) of every template file."""
    root = resources.files("adaptfl").joinpath(TEMPLATE)
    out: list[tuple[str, str]] = []

    def walk(node: Traversable, prefix: str) -> None:
        for child in sorted(node.iterdir(), key=lambda c: c.name):
            if child.is_dir():
                walk(child, f"{prefix}{child.name}/")
            elif child.name.endswith(SUFFIX):
                out.append((prefix + child.name.removesuffix(SUFFIX), child.read_text(encoding="utf-8")))

    walk(root, "")
    return out


def write_app(folder: Path, algorithm: str = "fedact", package: str | None = None) -> list[Path]:
    """Write the app into `folder` (absent or empty); the paths written. ValueError: refused."""
    from adaptfl.algorithms.catalog import catalog  # the named algorithms

    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise ValueError(f"{folder} exists and is not an empty folder: choose a new one")
    if algorithm not in catalog():
        raise ValueError(f"unknown algorithm {algorithm!r}; one of: {', '.join(catalog())}")
    project, default_package = default_names(folder)
    package = package or default_package
    why = check_package(package)
    if why:
        raise ValueError(why)
    values = {"project": project, "package": package, "algorithm": algorithm,
              "adaptfl_version": _version(), "results_dir": str(folder.resolve() / "results")}
    written = []
    for relative, text in template_files():
        parts = [package if p == PACKAGE_FOLDER else p for p in relative.split("/")]
        parts[-1] = DOTFILES.get(parts[-1], parts[-1])
        path = folder.joinpath(*parts)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(Template(text).substitute(values), encoding="utf-8")
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m adaptfl.new", description="Write a runnable Flower app on adaptfl into FOLDER.")
    parser.add_argument("folder", type=Path, help="a new or empty folder")
    parser.add_argument("--algorithm", default="fedact", help="adaptfl's algorithm (default: fedact)")
    parser.add_argument("--package", default=None,
                        help="the app's Python package name (default: from the folder's name)")
    args = parser.parse_args(argv)
    try:
        written = write_app(args.folder, args.algorithm, args.package)
    except ValueError as err:
        print(f"adaptfl.new: {err}", file=sys.stderr)
        return 2
    folder = args.folder
    print(f"wrote {len(written)} files into {folder}/ (algorithm {args.algorithm}); to run it:\n"
          f"  cd {folder} && pip install -e .\n"
          f"  FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 flwr run . --stream\n"
          f"  python -m adaptfl.flwr_run .   # the same, with an exit status that says how the run ended")
    return 0


if __name__ == "__main__":
    sys.exit(main())
