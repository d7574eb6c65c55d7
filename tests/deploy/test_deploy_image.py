"""The project image, checked without Docker: the build context holds every package, results land
in the results volume, and the base images' Python is one adaptfl supports."""

from __future__ import annotations

import fnmatch
import json
import re
import subprocess
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

from adaptfl.algorithms.config import RunConfig
from adaptfl.deploy import stand_in, wheelhouse
from adaptfl.server_app import outputs
from tests.support.wheels import build_wheel

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# Every package of the one tree, as its folder: what `packages.find` in pyproject.toml installs.
PACKAGE_FOLDERS = sorted(str(i.parent.relative_to(ROOT)) for i in (ROOT / "adaptfl").rglob("__init__.py")
                         if "__pycache__" not in i.parts)
IMAGE_HOME = "/app"  # HOME of Flower's images (and of the stand-ins)


def dockerignore_patterns() -> list[tuple[bool, str]]:
    """(exclude?, pattern) in file order; only the features this test evaluates are allowed."""
    patterns = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = line.lstrip("!")
        assert not pattern.startswith("/") and "[" not in pattern, f"unsupported pattern {line!r}"
        patterns.append((not negated, pattern))
    return patterns


def _matches(pattern: str, path: str) -> bool:
    """Docker's rule: a pattern matches a path or any of its parent folders; `**` any depth."""
    parts = path.split("/")
    for depth in range(1, len(parts) + 1):
        candidate = "/".join(parts[:depth])
        if pattern.startswith("**/"):
            if any(fnmatch.fnmatchcase(part, pattern[3:]) for part in candidate.split("/")[-1:]):
                return True
        elif fnmatch.fnmatchcase(candidate, pattern) and candidate.count("/") == pattern.count("/"):
            return True
    return False


def in_context(path: str) -> bool:
    included = True
    for exclude, pattern in dockerignore_patterns():
        if _matches(pattern, path):
            included = not exclude
    return included


def context_files() -> list[str]:
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    return [f for f in tracked if in_context(f)]


def test_the_ignore_rules_behave_as_docker_documents() -> None:
    """The evaluator above, on rules whose outcome Docker's documentation spells out."""
    assert in_context("adaptfl/algorithms/config.py") and in_context("adaptfl/deploy/fleet_proxy.py")
    assert in_context("LICENSE.md")  # pyproject's license file: the installed package carries it
    for folder in ("deploy/wheelhouse", "deploy/wheelhouse-cuda"):  # the Dockerfiles' WHEELHOUSE
        assert in_context(f"{folder}/torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl")
        assert in_context(f"{folder}/requirements.txt")
    for private in ("deploy/certs/ca/ca.key", "deploy/certs/supernode-1/supernode.key",
                    "deploy/certs/superlink/superexec.secret", "deploy/secrets/x",
                    "results/run/model.pt", ".git/config", "tests/deploy/test_deploy_image.py",
                    "adaptfl/strategies/__pycache__/base.cpython-311.pyc",
                    "deploy/wheelhouse/__pycache__/x.cpython-311.pyc"):
        assert not in_context(private), private


@pytest.mark.slow
def test_the_build_context_holds_every_package_pyproject_installs(tmp_path) -> None:
    """Build the wheel from exactly what Docker would send: every package must be in it."""
    files = context_files()
    assert len(PACKAGE_FOLDERS) > 10
    for folder in PACKAGE_FOLDERS:
        assert f"{folder}/__init__.py" in files, f"{folder}/ is not in the build context"
    names = set(zipfile.ZipFile(build_wheel(files, tmp_path)).namelist())
    for folder in PACKAGE_FOLDERS:
        assert f"{folder}/__init__.py" in names, folder
    assert "adaptfl/deploy/fleet_proxy.py" in names


def test_the_dockerfile_installs_the_whole_context_from_the_wheelhouse_only() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    run = re.search(r"^RUN (--mount=\S+) \\\n(.*?)(?=^\S)", text, re.M | re.S)
    assert run, "no RUN --mount step"
    options = run.group(1).removeprefix("--mount=").split(",")
    mount = dict(kv.split("=", 1) for kv in options if "=" in kv)
    assert mount["type"] == "bind" and "source" not in mount  # the whole (filtered) context
    body = run.group(2)
    installs = re.findall(r"pip install ([^&]*)", body)
    assert len(installs) == 2 and all("--no-index" in i for i in installs)
    last = [token for token in installs[1].split() if token != "\\"]
    assert last[-1] == "." and "--no-deps" in last
    assert "import adaptfl.server_app.app, adaptfl.client_app.app" in body
    assert not re.search(r"^COPY\b", text, re.M), "a COPY would leave the wheels in a layer"


def _fake_install(tmp_path: Path, monkeypatch, direct_url: dict) -> None:
    """Put an adaptfl dist-info with this direct_url.json first on sys.path."""
    info = tmp_path / "site" / "adaptfl-0.2.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: adaptfl\nVersion: 0.2.0\n")
    (info / "direct_url.json").write_text(json.dumps(direct_url))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))


def test_a_plain_pip_install_writes_results_under_home_the_results_volume(tmp_path, monkeypatch) -> None:
    """deploy/Dockerfile's `pip install .` records file:///tmp/adaptfl-src with dir_info: that
    is no checkout, so results go to $HOME/.adaptfl/results, which compose mounts as a volume."""
    _fake_install(tmp_path, monkeypatch, {"url": "file:///tmp/adaptfl-src", "dir_info": {}})
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert outputs.project_dir() is None
    assert outputs.results_root(RunConfig.of()) == tmp_path / "home" / ".adaptfl" / "results"

    yaml = pytest.importorskip("yaml")
    service = yaml.safe_load((DEPLOY / "compose.yml").read_text())["services"]["superexec-serverapp"]
    assert f"results:{IMAGE_HOME}/.adaptfl/results" in service["volumes"]
    assert f"ENV HOME={IMAGE_HOME}" in (DEPLOY / "flower-stand-in.Dockerfile").read_text()


def test_an_editable_install_still_writes_into_its_checkout(tmp_path, monkeypatch) -> None:
    checkout = tmp_path / "my checkout"
    _fake_install(tmp_path, monkeypatch, {"url": checkout.as_uri(), "dir_info": {"editable": True}})
    assert outputs.project_dir() == checkout
    assert outputs.results_root(RunConfig.of()) == checkout / "results"


def _python_of(tag: str) -> str:
    found = re.search(r"-py(3\.\d+)-", tag)
    assert found, f"tag {tag!r} names no Python: Flower's bare tags are its newest Python"
    return found.group(1)


def test_every_flower_base_image_runs_a_python_adaptfl_supports() -> None:
    supported = SpecifierSet(PYPROJECT["project"]["requires-python"])
    tags = {stand_in.FLOWER_TAG}
    tags |= set(re.findall(r"^ARG FLWR_TAG=(\S+)", (DEPLOY / "Dockerfile").read_text(), re.M))
    for name in ("compose.yml", "with-tls.yml", "with-cuda.yml"):
        tags |= set(re.findall(r"image: flwr/\w+:(\S+)", (DEPLOY / name).read_text()))
    assert len(tags) == 1, f"one Flower tag everywhere, found {tags}"
    assert f"{_python_of(tags.pop())}.0" in supported
    assert "3.13.0" not in supported  # why the bare tag (Python 3.13) would be wrong


def test_the_wheelhouse_holds_the_deployment_requirements_without_ray() -> None:
    reqs = wheelhouse.deployment_requirements()
    names = {re.split(r"[<>=\[; ]", r)[0] for r in reqs}
    declared = {re.split(r"[<>=\[; ]", r)[0] for r in PYPROJECT["project"]["dependencies"]}
    assert declared <= names and "setuptools" in names
    assert "flwr>=1.42.0,<1.43" in reqs and not any("simulation" in r for r in reqs)


def test_the_image_brings_a_c_compiler_for_the_native_loops_from_the_wheelhouse() -> None:
    """Flower's images have no C compiler: the project image installs zig's from the wheelhouse
    (no apt, nothing dialled) and names it in $CC, which local_update/native.py reads first."""
    assert wheelhouse.IMAGE_COMPILER.startswith("ziglang")
    assert wheelhouse.IMAGE_COMPILER in wheelhouse.deployment_requirements()
    text = (DEPLOY / "Dockerfile").read_text()
    cc = re.search(r"^ENV CC=(\S+)$", text, re.M)
    assert cc, "the image sets no CC"
    wrapper = rf"-m ziglang cc \"\$@\"\\n' \"\$\(command -v python\)\" > {re.escape(cc.group(1))}"
    assert re.search(wrapper, text), "CC is not the wrapper of zig's cc the image writes"
    assert text.index("ENV CC=") < text.index("USER app")  # the ClientApps (user app) see it
