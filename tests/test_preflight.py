"""Refused before Flower starts: `scripts/main_job.sh` runs the ServerApp's own preflight
(server_app/loop.py: build_run) through `check_overrides --preflight`, so a missing data file, a
missing label column or a `module:function` that does not import is one line and exit 2, with no
Flower process and no `.flwr/runs/<id>/` folder; `python -m adaptfl.engine` exits 2 for the same
input (server_app/exit_codes.py). No test here starts Flower."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from adaptfl.algorithms.check_overrides import main as check_overrides
from adaptfl.server_app.exit_codes import REFUSED_EXIT_CODE

from tests.flower_processes import PROJECT

SCRIPT = PROJECT / "scripts" / "main_job.sh"


def bad_tasks(tmp_path: Path) -> list[tuple[str, str]]:
    """(task=, what the one line must name): each fails only when the task is loaded."""
    table = tmp_path / "rows.csv"
    table.write_text("a,b,label\n" + "".join(f"{i},{i % 3},{i % 2}\n" for i in range(20)))
    return [(f"csv:{tmp_path / 'nonexistent.csv'}", "nonexistent.csv does not exist"),
            (f"csv:{table}?label=outcome", "no label column 'outcome'"),
            ("adaptfl_no_such_module.x:load", "cannot import 'adaptfl_no_such_module.x'"),
            ("json:no_such_function", "no_such_function")]


@pytest.mark.parametrize("case", range(4))
def test_check_overrides_preflight_refuses_in_one_line(capsys, tmp_path: Path, case: int) -> None:
    task, named = bad_tasks(tmp_path)[case]
    code = check_overrides(["--run-config", f"task='{task}' model='mlp'", "--get", "algorithm"])
    out, err = capsys.readouterr()
    assert code == 0 and out == "fedact\n", err  # without --preflight the task is not loaded
    code = check_overrides(["--preflight", "--run-config", f"task='{task}' model='mlp'"])
    out, err = capsys.readouterr()
    assert code == REFUSED_EXIT_CODE and out == "", err
    assert err.count("\n") == 1 and err.startswith("config error: ") and named in err, err


def test_check_overrides_preflight_passes_a_runnable_config(capsys, tiny_data) -> None:
    data_dir = tiny_data["fashion-mnist"]
    code = check_overrides(["--preflight", "--run-config", f"model='mlp' data-dir='{data_dir}'",
                            "--get", "model"])
    out, err = capsys.readouterr()
    assert code == 0 and out == "mlp\n", err


def test_check_overrides_preflight_refuses_a_run_name_in_use_and_removes_nothing(
        capsys, tiny_data, tmp_path: Path) -> None:
    held = tmp_path / "results" / "earlier"
    held.mkdir(parents=True)
    (held / "model.pt").write_bytes(b"an earlier run's model")
    base = f"model='mlp' data-dir='{tiny_data['fashion-mnist']}' results-dir='{tmp_path / 'results'}'"
    code = check_overrides(["--preflight", "--run-config", f"{base} run-name='earlier'"])
    _, err = capsys.readouterr()
    assert code == REFUSED_EXIT_CODE and err.count("\n") == 1 and "holds a run already" in err, err
    code = check_overrides(["--preflight", "--run-config", f"{base} run-name='earlier' overwrite=true"])
    _, err = capsys.readouterr()
    assert code == 0, err
    assert (held / "model.pt").read_bytes() == b"an earlier run's model"  # the ServerApp removes it, not this


@pytest.mark.parametrize("case", range(3))
def test_main_job_refuses_a_bad_task_before_flower_starts(tmp_path: Path, case: int) -> None:
    task, named = bad_tasks(tmp_path)[case]
    env = dict(os.environ, ADAPTFL_SKIP_SETUP="1", ADAPTFL_FLOWER_HOMES=str(tmp_path / "homes"))
    done = subprocess.run([str(SCRIPT), "--run-config", f"task='{task}' model='mlp'"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == REFUSED_EXIT_CODE, done.stdout + done.stderr
    assert done.stderr.splitlines() == [done.stderr.strip()], done.stderr  # exactly one line
    assert done.stderr.startswith("config error: ") and named in done.stderr, done.stderr
    assert "starting a private Flower SuperLink" not in done.stdout, done.stdout
    assert not (tmp_path / "homes").exists()  # no Flower home, no run folder


def test_engine_refuses_with_the_same_exit_code(tmp_path: Path) -> None:
    task, named = bad_tasks(tmp_path)[0]
    done = subprocess.run([sys.executable, "-m", "adaptfl.engine", "--num-nodes", "2", f"task='{task}'",
                           f"results-dir='{tmp_path}'"], capture_output=True, text=True, timeout=300,
                          cwd=PROJECT)
    assert done.returncode == REFUSED_EXIT_CODE, done.stderr[-2000:]
    assert done.stderr.strip().startswith("config error: ") and named in done.stderr, done.stderr
    assert done.stderr.strip().count("\n") == 0, done.stderr


def test_engine_help_is_fast_and_names_the_program() -> None:
    """`--help` imports neither torch nor Flower (they take seconds), and names the real command."""
    probe = ("import sys\nfrom adaptfl.engine.__main__ import main\ntry:\n    main(['--help'])\n"
             "except SystemExit:\n    pass\nprint(sorted(m for m in ('torch', 'flwr', 'datasets') "
             "if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          cwd=PROJECT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: python -m adaptfl.engine "), done.stdout
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout
