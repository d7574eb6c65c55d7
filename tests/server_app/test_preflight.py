"""Refused before Flower starts: `scripts/main_job.sh` runs the ServerApp's own preflight
(server_app/loop.py: build_run) through `check_overrides --preflight`, so a missing data file, a
missing label column, a `module:function` that does not import or a model of the wrong output
width is one line and exit 2, with no Flower process and no `.flwr/runs/<id>/` folder;
`python -m adaptfl.engine` exits 2 for the same input (core/exit_codes.py). No test here
starts Flower (where one would, the check it tests has failed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from adaptfl.core.exit_codes import REFUSED_EXIT_CODE
from adaptfl.server_app.check_overrides import main as check_overrides
from tests.support.flower_processes import PROJECT

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


@pytest.mark.parametrize(("dp", "named"), [
    ("dp-target-epsilon=1.0", "dp-target-epsilon=1: 20 rounds of dp-noise-multiplier=1, 10 of 10"),
    ("dp-clip-lr=0.2", "dp-count-stddev=0.5: the clipped counts of 2 records"),  # σ_b = n/20
])
def test_preflight_with_the_node_count_refuses_what_needs_the_nodes(
        capsys, tiny_data, dp: str, named: str) -> None:
    """main_job passes num-supernodes as --nodes: dp's checks that need the population come
    before Flower starts (issue 31 §8), not at round 1 after a round-0 row."""
    config = f"model='mlp' data-dir='{tiny_data['fashion-mnist']}' dp='central' weighting='uniform' {dp}"
    assert check_overrides(["--preflight", "--run-config", config]) == 0, capsys.readouterr().err
    capsys.readouterr()
    code = check_overrides(["--preflight", "--nodes", "10", "--run-config", config])
    _, err = capsys.readouterr()
    assert code == REFUSED_EXIT_CODE and err.count("\n") == 1 and named in err, err


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


# A subprocess each (bash, then torch's import): ~5 s on idle cores, so in the full suite only;
# the fast subset holds the same preflight in-process (check_overrides above).
@pytest.mark.slow
@pytest.mark.parametrize("case", range(3))
def test_main_job_refuses_a_bad_task_before_flower_starts(tmp_path: Path, case: int) -> None:
    task, named = bad_tasks(tmp_path)[case]
    env = dict(os.environ, ADAPTFL_SKIP_SETUP="1", ADAPTFL_FLOWER_HOMES=str(tmp_path / "homes"))
    # a results-dir of its own and one round: should the check ever let this through, the run is
    # short and writes nothing into the checkout
    done = subprocess.run([str(SCRIPT), "--run-config", f"task='{task}' model='mlp' "
                           f"results-dir='{tmp_path / 'results'}' num-server-rounds=1"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == REFUSED_EXIT_CODE, done.stdout + done.stderr
    assert done.stderr.splitlines() == [done.stderr.strip()], done.stderr  # exactly one line
    assert done.stderr.startswith("config error: ") and named in done.stderr, done.stderr
    assert "starting a private Flower SuperLink" not in done.stdout, done.stdout
    assert not (tmp_path / "homes").exists()  # no Flower home, no run folder


@pytest.mark.slow
def test_main_job_checks_dp_with_its_num_supernodes_before_flower_starts(tmp_path: Path) -> None:
    env = dict(os.environ, ADAPTFL_SKIP_SETUP="1", ADAPTFL_FLOWER_HOMES=str(tmp_path / "homes"))
    done = subprocess.run([str(SCRIPT), "--federation-config", "num-supernodes=4", "--run-config",
                           f"model='mlp' dp='central' weighting='uniform' dp-target-epsilon=1.0 "
                           f"results-dir='{tmp_path / 'results'}'"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == REFUSED_EXIT_CODE, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and "4 of 4 nodes sampled" in done.stderr, done.stderr
    assert not (tmp_path / "homes").exists() and not (tmp_path / "results").exists()


@pytest.mark.slow  # a subprocess that imports torch
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


def width_model(task, extra: int):  # noqa: ANN001, ANN201 - model=<module>:<function> builders
    width = task.num_outputs + extra
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(task.input_shape[0], width))


def too_wide(task):  # noqa: ANN001, ANN201
    return width_model(task, 2)


def too_narrow(task):  # noqa: ANN001, ANN201
    return width_model(task, -1)


@pytest.mark.slow
@pytest.mark.parametrize(("builder", "width"), [("too_wide", 5), ("too_narrow", 2)])
def test_main_job_refuses_a_model_of_the_wrong_output_width(tmp_path: Path, builder: str, width: int) -> None:
    """The preflight's width check (server_app/run_checks.py: check_model) through main_job: a
    3-class CSV and a model of 5 or 2 outputs, one line naming both numbers, exit 2, no Flower."""
    table = tmp_path / "three.csv"
    table.write_text("a,b,label\n" + "".join(f"{i},{i % 5},{i % 3}\n" for i in range(30)))
    env = dict(os.environ, ADAPTFL_SKIP_SETUP="1", ADAPTFL_FLOWER_HOMES=str(tmp_path / "homes"))
    done = subprocess.run([str(SCRIPT), "--run-config",
                           f"task='csv:{table}' model='tests.server_app.test_preflight:{builder}' "
                           f"results-dir='{tmp_path / 'results'}' num-server-rounds=1"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == REFUSED_EXIT_CODE, done.stdout + done.stderr
    assert done.stderr.splitlines() == [done.stderr.strip()], done.stderr  # exactly one line
    assert f"gives {width} outputs" in done.stderr and "num_outputs=3" in done.stderr, done.stderr
    assert not (tmp_path / "homes").exists()


@pytest.mark.parametrize(("builder", "width"), [("too_wide", 5), ("too_narrow", 2)])
def test_check_overrides_preflight_refuses_the_wrong_output_width(capsys, tmp_path: Path, builder: str,
                                                                  width: int) -> None:
    table = tmp_path / "three.csv"
    table.write_text("a,b,label\n" + "".join(f"{i},{i % 5},{i % 3}\n" for i in range(30)))
    code = check_overrides(["--preflight", "--run-config",
                            f"task='csv:{table}' model='tests.server_app.test_preflight:{builder}'"])
    _, err = capsys.readouterr()
    assert code == REFUSED_EXIT_CODE and err.count("\n") == 1, err
    assert f"gives {width} outputs" in err and "num_outputs=3" in err, err


def test_engine_print_config_names_where_each_value_came_from(capsys) -> None:
    """issue 33: the resolved config (presets filled in), one TOML line per key the run reads."""
    from adaptfl.engine.__main__ import main

    main(["--print-config", "algorithm=fedact", "tau=0.3"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("# algorithm 'fedact':")
    assert "tau = 0.3  # yours" in lines and 'algorithm = "fedact"  # yours' in lines
    assert 'trust = "act"  # fedact\'s preset' in lines  # a component the algorithm chose
    assert "dp-delta = 1e-05  # default" in lines
    assert not any(line.startswith("mu = ") for line in lines)  # HaFedHo's: fedact reads no mu
