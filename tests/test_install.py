"""`pip install .` as a user does it: one `adaptfl` package that holds every module of the tree.

The suite itself imports from the checkout (an editable install, whose finder maps any
`adaptfl.*` name to the folders here), so a package left out of the wheel would go unnoticed
everywhere else: these tests build the wheel from a clean copy of the tracked files, install it
into a fresh virtual environment, and import each of its modules from there alone.
"""

from __future__ import annotations

import subprocess
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

from tests.wheels import build_wheel, tracked_files

ROOT = Path(__file__).resolve().parent.parent
SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]

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
    """Every folder holding an __init__.py under the mapped folders, as its dotted name."""
    found = {}
    for package, folder in SETUPTOOLS["package-dir"].items():
        for init in sorted((ROOT / folder).rglob("__init__.py")):
            relative = init.parent.relative_to(ROOT / folder)
            if "__pycache__" not in relative.parts:
                found[".".join((package, *relative.parts))] = str(init.parent.relative_to(ROOT))
    return found


def test_every_package_folder_is_listed_for_installation() -> None:
    listed = set(SETUPTOOLS["packages"])
    missing = {name: folder for name, folder in package_folders().items() if name not in listed}
    assert not missing, f"pyproject.toml [tool.setuptools] packages leaves out {missing}"
    assert listed <= set(package_folders()), listed - set(package_folders())


@pytest.mark.slow
def test_a_fresh_venv_gets_adaptfl_alone_and_every_module_imports(tmp_path: Path) -> None:
    wheel = build_wheel(tracked_files(), tmp_path)  # from what a fresh clone holds
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"adaptfl", wheel.name.split("-py3")[0] + ".dist-info"}
    assert "adaptfl/harness/grids/fedact.toml" in names  # package data
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
