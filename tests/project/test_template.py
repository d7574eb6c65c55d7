"""`python -m adaptfl.new <folder>` (issue 33): a complete Flower app on adaptfl in one command.

Fast: the files written, the names substituted, a config adaptfl accepts, Flower-findable
`app = ...` assignments, ruff-clean code, a refused non-empty folder; the templates are package
data outside the FAB. Slow: the generated app, installed nowhere, runs 2 rounds under `flwr run`.
"""

from __future__ import annotations

import ast
import importlib
import io
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from flwr.cli.build import build_fab_from_disk
from flwr.supercore.utils import is_valid_name

from adaptfl.algorithms.catalog import catalog
from adaptfl.algorithms.config import RunConfig, declared_keys
from adaptfl.new import default_names, main, write_app
from tests.support.flower_processes import PROJECT, flwr_run_app_dir
from tests.support.run_outputs import metric_rows

TEMPLATES = PROJECT / "adaptfl" / "templates" / "app"
EXPECTED = {"pyproject.toml", "README.md", ".gitignore", "my_fl_app/__init__.py", "my_fl_app/server_app.py",
            "my_fl_app/client_app.py", "my_fl_app/task.py"}


def _files(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


def _config(app: Path) -> dict:
    with open(app / "pyproject.toml", "rb") as fh:
        return tomllib.load(fh)


def test_the_app_has_its_files_and_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    app = tmp_path / "My FL-App"
    assert main([str(app), "--algorithm", "fedadam"]) == 0
    assert "flwr run . --stream" in capsys.readouterr().out
    assert _files(app) == EXPECTED
    for path in app.rglob("*"):
        if path.is_file():
            text = path.read_text()
            assert "$" not in text, f"{path.name}: a placeholder left"
    pyproject = _config(app)
    assert pyproject["project"]["name"] == "my-fl-app"
    assert pyproject["tool"]["setuptools"]["packages"] == ["my_fl_app"]
    flwr = pyproject["tool"]["flwr"]["app"]
    assert flwr["publisher"]
    assert "federations" not in pyproject["tool"]["flwr"]  # Flower 1.42 would move it to config.toml
    assert flwr["components"] == {"serverapp": "my_fl_app.server_app:app",
                                  "clientapp": "my_fl_app.client_app:app"}
    config = flwr["config"]
    assert config["algorithm"] == "fedadam"
    assert config["task"] == "my_fl_app.task:load" and config["model"] == "my_fl_app.task:build"
    assert set(config) <= set(declared_keys()) and len(config) < 20  # only the keys it sets
    assert config["results-dir"] == str((app / "results").resolve())
    RunConfig.from_flower(config)  # every value is one adaptfl accepts
    readme = (app / "README.md").read_text()
    for said in ("pip install -e .", "flwr run . --stream", "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1",
                 '--federation-config "num-supernodes=', "my_fl_app/task.py", "fedadam"):
        assert said in readme, said


@pytest.mark.parametrize("algorithm", sorted(catalog()))
def test_every_algorithm_gets_a_config_adaptfl_accepts(tmp_path: Path, algorithm: str) -> None:
    write_app(tmp_path / "app", algorithm=algorithm)
    config = _config(tmp_path / "app")["tool"]["flwr"]["app"]["config"]
    assert RunConfig.from_flower(config).algorithm.name == algorithm


def test_the_template_and_the_readme_app_have_distinct_names() -> None:
    """Run one after the other, two apps of one package name would import each other's code
    (Flower's managed SuperLink keeps the first app's folder on the import path)."""
    readme = (PROJECT / "README.md").read_text()
    template_default = default_names(Path("my-app"))[1]
    assert "python -m adaptfl.new my-app" in readme and f"`{template_default}.py`" not in readme
    assert "`fedact_app.py`" in readme


def test_the_docs_name_the_command() -> None:
    assert "python -m adaptfl.new" in (PROJECT / "README.md").read_text()
    assert "## A new app in one command" in (PROJECT / "docs" / "own-app.md").read_text()


def test_the_app_objects_are_plain_assignments_flower_can_find(tmp_path: Path) -> None:
    """Flower 1.42 finds `module:attr` by reading the source for `attr = ...` (not a tuple)."""
    write_app(tmp_path / "app", package="pkg")
    for module, cls in (("server_app", "ServerApp"), ("client_app", "ClientApp")):
        tree = ast.parse((tmp_path / "app" / "pkg" / f"{module}.py").read_text())
        found = [n for n in tree.body if isinstance(n, ast.Assign) and len(n.targets) == 1
                 and isinstance(n.targets[0], ast.Name) and n.targets[0].id == "app"]
        assert len(found) == 1 and ast.unparse(found[0].value) == f"{cls}()", module


def test_the_generated_task_and_model_fit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_app(tmp_path / "app", package="fit_app")
    monkeypatch.syspath_prepend(str(tmp_path / "app"))
    task_module = importlib.import_module("fit_app.task")
    task = task_module.load("")
    model = task_module.build(task)
    x, y = task.train.batch(task.train.labels.new_tensor([0, 1, 2]))
    assert model(x).shape == (3, task.num_outputs) and y.shape == (3,)
    again = task_module.load("")  # the server and every node build the same data
    assert (again.train.features == task.train.features).all()
    for name in [m for m in sys.modules if m == "fit_app" or m.startswith("fit_app.")]:
        del sys.modules[name]


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is not installed")
def test_the_generated_code_is_ruff_clean(tmp_path: Path) -> None:
    write_app(tmp_path / "app")
    done = subprocess.run(["ruff", "check", "--no-cache", "--isolated", "--line-length", "110",
                           "--select", "E,F,W,B,UP", str(tmp_path / "app")],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_non_empty_folder_is_refused_in_one_line(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "mine.txt").write_text("keep me")
    assert main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "not an empty folder" in err, err
    assert _files(tmp_path) == {"mine.txt"}
    (tmp_path / "empty").mkdir()  # an empty folder is fine
    assert main([str(tmp_path / "empty")]) == 0


def test_bad_names_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "a"), "--algorithm", "fedfoo"]) == 2
    assert "unknown algorithm 'fedfoo'" in capsys.readouterr().err
    assert main([str(tmp_path / "b"), "--package", "json"]) == 2
    assert main([str(tmp_path / "c"), "--package", "no-dash"]) == 2
    capsys.readouterr()
    assert main([str(tmp_path / "d"), "--package", "pytest"]) == 2  # importable: another app's, say
    assert "package name 'pytest' is already importable here" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
    assert default_names(Path("2024 Study")) == ("app-2024-study", "app_2024_study")
    for folder in ("2024 Study", "ünïcode", "x" * 40 + " y", "My FL-App"):
        assert is_valid_name(default_names(Path(folder))[0])[0], folder  # Flower's rule for the name


def test_the_templates_ship_in_the_wheel_not_in_the_fab() -> None:
    """Package data (pyproject's pattern matches every template) and .tmpl, so neither the FAB's
    include rules (.py/.toml/.md/.yml) nor ruff or mypy see the placeholders."""
    setuptools = tomllib.loads((PROJECT / "pyproject.toml").read_text())["tool"]["setuptools"]
    matched: set[Path] = set()
    for pattern in setuptools["package-data"]["adaptfl"]:
        matched |= set((PROJECT / "adaptfl").glob(pattern))
    templates = {p for p in TEMPLATES.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    assert templates and templates <= matched
    assert all(p.suffix == ".tmpl" for p in templates)
    names = zipfile.ZipFile(io.BytesIO(build_fab_from_disk(PROJECT))).namelist()
    assert "adaptfl/new.py" in names and not any("templates/" in n for n in names)


def test_the_results_stay_out_of_the_apps_bundle(tmp_path: Path) -> None:
    """Flower's FAB takes *.json/*.jsonl; the app's .gitignore keeps its results/ out."""
    app = tmp_path / "app"
    write_app(app)
    (app / "results" / "run").mkdir(parents=True)
    (app / "results" / "run" / "metrics.jsonl").write_text("{}\n")
    (app / "me.app.0.1.0.fab").write_bytes(b"an earlier flwr build")
    (app / "dist").mkdir()
    (app / "dist" / "app-0.1.0.tar.gz").write_bytes(b"")
    names = zipfile.ZipFile(io.BytesIO(build_fab_from_disk(app))).namelist()
    assert "app/task.py" in names and "README.md" in names
    assert not any(n.startswith(("results/", "dist/")) or n.endswith(".fab") for n in names), names


def test_build_outputs_are_ignored_in_this_checkout() -> None:
    if not (PROJECT / ".git").exists():
        pytest.skip("not a git checkout")
    for path in ("me.my-app.0.1.0.fab", "examples/own-data-model/x.fab", "dist/adaptfl.tar.gz"):
        done = subprocess.run(["git", "check-ignore", "-q", path], cwd=PROJECT, check=False)
        assert done.returncode == 0, f"{path} is not ignored by .gitignore"


@pytest.mark.slow
@pytest.mark.flower
@pytest.mark.skipif(shutil.which("flwr") is None, reason="the flwr CLI is not installed")
def test_the_generated_app_runs_two_rounds_under_flwr_run(tmp_path: Path) -> None:
    """Through the command the app's README gives (`python -m adaptfl.flwr_run`): a refused
    config exits 2 in one line, a completed run 0 with the ServerApp's summary line (plain `flwr
    run` exits 0 for both); with federated evaluation, which the template's ClientApp answers."""
    app = tmp_path / "my-app"
    assert main([str(app), "--algorithm", "fedact"]) == 0
    results = tmp_path / "results"
    refused = flwr_run_app_dir(app, tmp_path / "flwr-home", num_supernodes=2, with_status=True,
                               run_config="num-server-rounds=2 local-steps=0")
    out = refused.stdout + refused.stderr
    assert refused.returncode == 2, out[-4000:]
    # refused by the wrapper's own check of the --run-config text, before Flower starts
    assert "config error: invalid local-steps=0: must be >= 1" in out, out[-4000:]
    # three SuperNodes: rounds of three (two would need accept-small-rounds, a key the app's
    # own config does not list: Flower refuses a --run-config key missing there)
    done = flwr_run_app_dir(app, tmp_path / "flwr-home", num_supernodes=3, with_status=True,
                            run_config=f"num-server-rounds=2 results-dir='{results}' run-name='t' "
                                       "fraction-evaluate=1.0")
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "Unable to find attribute" not in out, out[-4000:]
    rows = metric_rows(results / "t")
    assert [r["round"] for r in rows] == [1, 2], out[-4000:]
    assert [r["replies-accepted"] for r in rows] == [3, 3], rows
    assert [r["fed-eval-replies"] for r in rows] == [3, 3], rows  # the template's @app.evaluate
    summary = f"adaptfl: run completed: round 2, test-accuracy {rows[-1]['test-accuracy']:.4f} " \
              f"(initial model "
    assert summary in out and f"; results: {results / 't'}" in out, out[-4000:]
    assert "finished:completed; exit 0" in out, out[-4000:]
