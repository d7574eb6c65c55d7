"""The loopback kit's work folder (docs/deployment.md, "Where the loopback kit writes"): its keys
and secrets go to the current folder or the per-user cache, never into the checkout."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from adaptfl.deploy.loopback import PROJECT, WORKDIR_NAME, default_workdir


def test_outside_the_checkout_the_current_folder(tmp_path: Path) -> None:
    assert default_workdir(tmp_path, checkout=PROJECT) == tmp_path.resolve() / WORKDIR_NAME


def test_inside_the_checkout_the_per_user_cache(tmp_path: Path) -> None:
    for cwd in (PROJECT, PROJECT / "docs"):
        got = default_workdir(cwd, checkout=PROJECT, env={"XDG_CACHE_HOME": str(tmp_path)})
        assert got == tmp_path / "adaptfl" / WORKDIR_NAME
        assert PROJECT.resolve() not in got.parents
    home = default_workdir(PROJECT, checkout=PROJECT, env={})
    assert home == Path.home() / ".cache" / "adaptfl" / WORKDIR_NAME


def test_the_help_names_workdir_and_its_default() -> None:
    done = subprocess.run([sys.executable, "-m", "adaptfl.deploy.loopback", "--help"], capture_output=True,
                          text=True, timeout=120, check=True, cwd=PROJECT)
    text = " ".join(done.stdout.split())
    assert "--workdir" in text and f"./{WORKDIR_NAME}" in text and "~/.cache/adaptfl" in text


def test_the_docs_say_where_it_writes() -> None:
    text = (PROJECT / "docs" / "deployment.md").read_text()
    assert "--workdir DIR" in text and "~/.cache/adaptfl/loopback-deploy/" in text
    main_job = (PROJECT / "docs" / "main-job.md").read_text()
    assert "ADAPTFL_FLOWER_HOMES" in text and "ADAPTFL_FLOWER_HOMES" in main_job
