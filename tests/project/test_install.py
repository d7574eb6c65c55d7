"""`pip install .` as a user does it: one `adaptfl` package that holds every module of the tree.

The suite itself imports from the checkout (an editable install), so a package left out of the
wheel would go unnoticed everywhere else: these tests build the wheel from a clean copy of the
tracked files, install it into a fresh virtual environment, and import each module from there.
"""

from __future__ import annotations

import io
import subprocess
import sys
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

from tests.support.wheels import build_wheel, tracked_files

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

# Imports every module named after the first argument with the editable install's finder
# removed (it would serve a module missing from the wheel out of the checkout); each must come
# from the folder that the first argument names.
IMPORT_ALL = """
import importlib, sys
sys.meta_path = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
home, names = sys.argv[1], sys.argv[2:]
for name in names:
    module = importlib.import_module(name)
    if not module.__file__.startswith(home):
        sys.exit(f"{name} was imported from {module.__file__}, not from {home}")
print(len(names))
"""


def package_folders() -> dict[str, str]:
    """Every folder holding an __init__.py in the one package tree, as its dotted name."""
    return {".".join(init.parent.relative_to(ROOT).parts): str(init.parent.relative_to(ROOT))
            for init in sorted((ROOT / "adaptfl").rglob("__init__.py")) if "__pycache__" not in init.parts}


def test_one_package_tree_with_the_top_level_folders_as_links_into_it() -> None:
    """No folder mapping, no path extension at import: the tree on disk is the package."""
    setuptools = PYPROJECT["tool"]["setuptools"]
    assert "package-dir" not in setuptools, setuptools
    assert setuptools["packages"] == {"find": {"include": ["adaptfl*"]}}, setuptools
    assert "__path__" not in (ROOT / "adaptfl" / "__init__.py").read_text()
    assert len(package_folders()) > 10
    for link in ("server_app", "client_app", "strategies"):
        assert (ROOT / link).is_symlink(), f"{link} should be a link into adaptfl/"
        assert (ROOT / link).resolve() == (ROOT / "adaptfl" / link).resolve(), link
    # deploy/ is a real folder (what Docker and operators read): compose resolves `..` in it to
    # the repository root whether it follows links (v1) or keeps the path it was given (v2)
    assert (ROOT / "deploy").is_dir() and not (ROOT / "deploy").is_symlink()
    for name in ("adaptfl.adaptfl", "adaptfl.tests", "adaptfl.benchmarks"):
        tried = subprocess.run([sys.executable, "-c", f"import {name}"], cwd=ROOT.parent,
                               capture_output=True, text=True, timeout=120, check=False)
        assert tried.returncode == 1 and "ModuleNotFoundError" in tried.stderr, (name, tried.stderr[-500:])


def test_the_flower_app_bundle_is_the_package_alone() -> None:
    """`flwr run` ships the FAB Flower builds from the checkout: the package, pyproject.toml and
    the license file Flower Hub's FAB format asks for, none of tests/, docs/, benchmarks/,
    examples/, scripts/ (the root links are not followed)."""
    from flwr.cli.build import build_fab_from_disk  # noqa: PLC0415 - test-only

    names = zipfile.ZipFile(io.BytesIO(build_fab_from_disk(ROOT))).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"adaptfl", "pyproject.toml", "LICENSE.md", ".info"}, tops
    assert "adaptfl/strategies/base.py" in names and "adaptfl/server_app/app.py" in names
    assert not any(n.startswith(("strategies/", "deploy/")) for n in names)


@pytest.mark.slow
def test_a_fresh_venv_gets_adaptfl_alone_and_every_module_imports(tmp_path: Path) -> None:
    wheel = build_wheel(tracked_files(), tmp_path)  # from what a fresh clone holds
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"adaptfl", wheel.name.split("-py3")[0] + ".dist-info"}
    assert "adaptfl/harness/grids/fedact.toml" in names  # package data
    assert "adaptfl/templates/app/package/task.py.tmpl" in names  # python -m adaptfl.new's templates
    modules = sorted(n.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
                     for n in names if n.endswith(".py") and not n.endswith("__main__.py"))
    for package in package_folders():  # every module of the tree made it into the wheel
        folder = ROOT / package_folders()[package]
        for py in folder.glob("*.py"):
            if py.name not in ("__init__.py", "__main__.py"):
                assert f"{package}.{py.stem}" in modules, f"{package}.{py.stem} is not in the wheel"

    env = tmp_path / "venv"  # the dependencies come from this interpreter's site-packages
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(env)
    python = env / "bin" / "python"
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               capture_output=True, text=True, check=True).stdout.strip())
    before = set(p.name for p in site.iterdir())
    installed = subprocess.run([python, "-m", "pip", "install", "--no-deps", "--no-index", "-q",
                                str(wheel)], capture_output=True, text=True, timeout=300, check=False)
    assert installed.returncode == 0, installed.stderr[-3000:]
    added = set(p.name for p in site.iterdir()) - before
    assert added == {"adaptfl", wheel.name.split("-py3")[0] + ".dist-info"}, added

    imported = subprocess.run([python, "-c", IMPORT_ALL, str(site / "adaptfl"), *modules], cwd=tmp_path,
                              capture_output=True, text=True, timeout=600, check=False)
    assert imported.returncode == 0, imported.stderr[-3000:]
    assert int(imported.stdout.strip()) == len(modules) > 100

    # The tools that work on the source tree (images, `flwr run` of its pyproject) say so in one
    # line instead of reaching for files the wheel does not ship.
    tool = subprocess.run([python, "-c", "import sys, adaptfl; sys.meta_path = [f for f in sys.meta_path "
                           "if 'editable' not in repr(f).lower()]; assert adaptfl.source_checkout() is None; "
                           "from adaptfl.deploy.loopback import run_loopback; run_loopback(None, 1, None)"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert tool.returncode == 1, tool.stderr[-2000:]
    assert tool.stderr.strip().splitlines()[-1].startswith(
        "RuntimeError: python -m adaptfl.deploy.loopback works on adaptfl's source checkout")
