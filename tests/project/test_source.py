"""The README's commands work wherever the user stands: in the folder that CONTAINS a clone named
`adaptfl` (the clone is then a namespace portion `adaptfl` in the current folder, which the
checkout's regular package on the install's path entry outranks) and in an unrelated folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.flower_processes import PROJECT


def where_to_stand(tmp_path: Path, place: str) -> tuple[Path, dict[str, str]]:
    """(the folder to run in, the environment). "parent": a folder holding the clone as
    `adaptfl`, with no PYTHONPATH (a user's shell; PYTHONPATH's regular package would win over
    the namespace and hide the case). "elsewhere": an empty folder, this test's environment."""
    env = dict(os.environ)
    folder = tmp_path / place
    folder.mkdir()
    if place == "parent":
        (folder / "adaptfl").symlink_to(PROJECT, target_is_directory=True)
        env.pop("PYTHONPATH", None)
    return folder, env


def run(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("place", ["parent", "elsewhere"])
@pytest.mark.slow
def test_readme_commands_run_from_any_folder(tmp_path: Path, place: str) -> None:
    cwd, env = where_to_stand(tmp_path, place)
    found = run([sys.executable, "-c", "from adaptfl.source import source_checkout; "
                 "print(source_checkout())"], cwd, env)
    assert found.returncode == 0, found.stderr[-2000:]
    if place == "parent":  # the clone itself, not a namespace package made of it
        assert Path(found.stdout.strip()).resolve() == PROJECT.resolve(), found.stdout

    checked = run([sys.executable, "-m", "adaptfl.server_app.check_overrides", "--run-config", "tau=0"],
                  cwd, env)
    assert checked.returncode == 2, checked.stderr[-2000:]
    assert checked.stderr.startswith("config error: ") and "tau" in checked.stderr, checked.stderr
    assert checked.stderr.count("\n") == 1, checked.stderr

    helped = run([sys.executable, "-m", "adaptfl.engine", "--help"], cwd, env)
    assert helped.returncode == 0 and helped.stdout.startswith("usage: python -m adaptfl.engine"), \
        helped.stderr[-2000:]


@pytest.mark.slow
def test_main_job_runs_from_the_parent_folder(tmp_path: Path) -> None:
    cwd, env = where_to_stand(tmp_path, "parent")
    env.update(ADAPTFL_SKIP_SETUP="1", ADAPTFL_FLOWER_HOMES=str(tmp_path / "homes"))
    done = run(["adaptfl/scripts/main_job.sh", "--run-config", "taux=0.3"], cwd, env)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stderr.strip() == done.stderr.strip().splitlines()[0], done.stderr
    assert "'taux' (did you mean 'tau'?)" in done.stderr, done.stderr
    assert not (tmp_path / "homes").exists()
