"""Checkpoint and resume: a killed server continues to the very model an uninterrupted run gives."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from adaptfl.algorithms.config import RunConfig
from adaptfl.engine.inprocess import run_inprocess
from adaptfl.server_app.checkpoint import STATE_FILE, load_checkpoint, resume_source
from adaptfl.strategies.state import ServerState
from tests.conftest import needs_fashion_mnist
from tests.support.flower_processes import PROJECT
from tests.support.run_outputs import assert_same_model, completed_round, final_model, kill_when, metric_rows

SETTINGS = {"model": "mlp", "num-server-rounds": 4, "local-steps": 20, "batch-size": 32,
            "num-threads": 1, "seed": 7}


def _engine_command(results: Path, run_name: str, resume: bool) -> list[str]:
    pairs = [f"{k}={json.dumps(v)}" for k, v in SETTINGS.items()]
    pairs += ["figures=false", f"results-dir={json.dumps(str(results))}", f"run-name={json.dumps(run_name)}",
              f"resume={'true' if resume else 'false'}"]
    return [sys.executable, "-m", "adaptfl.engine", "--num-nodes", "3", *pairs]


def _kill_after_round(command: list[str], run_dir: Path, target: int) -> int:
    """Start the server, SIGKILL it once round `target` is checkpointed; returns that round."""
    kill_when(command, PROJECT, lambda: completed_round(run_dir) >= target, f"round {target}", 180)
    return completed_round(run_dir)


@pytest.mark.slow
@needs_fashion_mnist
def test_killed_after_round_2_of_4_then_resumed_equals_uninterrupted(tmp_path) -> None:
    results = tmp_path / "results"
    run_dir = results / "killed"
    reached = _kill_after_round(_engine_command(results, "killed", resume=False), run_dir, target=2)
    assert 2 <= reached < 4, f"the kill came too late to test resume (round {reached})"
    assert not (run_dir / "model.pt").exists()

    done = subprocess.run(_engine_command(results, "killed", resume=True), cwd=PROJECT,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"resuming from {run_dir} after round {reached}" in done.stderr

    cfg = RunConfig.from_flower({**SETTINGS, "figures": False,
                                 "results-dir": str(results), "run-name": "whole"})
    whole_dir = run_inprocess(cfg, num_nodes=3)
    resumed = final_model(run_dir)
    whole = final_model(whole_dir)
    assert_same_model(resumed, whole)
    rows = metric_rows(run_dir)
    whole_rows = metric_rows(whole_dir)
    assert [r["round"] for r in rows] == [1, 2, 3, 4]
    assert [r["test-accuracy"] for r in rows] == [r["test-accuracy"] for r in whole_rows]


def _fake_run_dir(tmp_path: Path, cfg: RunConfig, server_round: int, rows: list[str]) -> Path:
    run_dir = tmp_path / cfg.output.run_name
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps(cfg.to_flower()))
    (run_dir / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    ServerState(server_round=server_round, model={"w": torch.ones(2)}).save(run_dir / STATE_FILE)
    return run_dir


def test_resume_drops_rows_newer_than_the_state_and_a_line_cut_short(tmp_path) -> None:
    cfg = RunConfig.of(figures=False, results_dir=str(tmp_path), run_name="r", resume=True)
    rows = ['{"round": 1}', '{"round": 2}', '{"round": 3}', '{"round": 4, "test-acc']
    run_dir = _fake_run_dir(tmp_path, cfg, server_round=2, rows=rows)
    checkpoint = load_checkpoint(cfg, resume_source(cfg, run_dir))
    assert checkpoint.state.server_round == 2
    assert [r["round"] for r in checkpoint.rows] == [1, 2]
    # the torn line is this test's own fixture, not a row the code wrote (conftest's session
    # check parses every metrics row left under the session's folders)
    (run_dir / "metrics.jsonl").unlink()


def test_resume_refuses_a_checkpoint_of_another_job(tmp_path) -> None:
    cfg = RunConfig.of(figures=False, results_dir=str(tmp_path), run_name="r", resume=True)
    run_dir = _fake_run_dir(tmp_path, cfg, server_round=1, rows=['{"round": 1}'])
    with pytest.raises(ValueError, match="rho: 0.5 -> 0.3"):
        load_checkpoint(cfg.replace(rho=0.3), run_dir)
    # Where and how it runs may change.
    load_checkpoint(cfg.replace(round_timeout=30.0, device="cpu"), run_dir)


def test_resume_settings_that_cannot_work_are_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match="needs run-name"):
        resume_source(RunConfig.of(resume=True), None)
    with pytest.raises(ValueError, match="resume-from='rel/dir' must be an absolute path"):
        resume_source(RunConfig.of(resume_from="rel/dir"), None)
    with pytest.raises(ValueError, match="holds no state.pt"):
        resume_source(RunConfig.of(resume_from=str(tmp_path)), None)
    with pytest.raises(ValueError, match="expected true or false"):
        RunConfig.from_flower({"resume": 1})
    fresh = RunConfig.of(figures=False, results_dir=str(tmp_path), run_name="new", resume=True)
    (tmp_path / "new").mkdir()  # a run killed before its first checkpoint
    assert resume_source(fresh, tmp_path / "new") is None  # nothing to resume yet: round 1


def test_resume_of_a_misspelt_run_name_is_refused_naming_it(tmp_path) -> None:
    # Issue 33 §7: resume=true with a run-name that has no folder started a fresh run with only a
    # WARNING; it is refused (exit 2 from the engine and the preflight), naming the close names.
    (tmp_path / "fedact-run1").mkdir()
    typo = RunConfig.of(figures=False, results_dir=str(tmp_path), run_name="fedact-rnu1", resume=True)
    with pytest.raises(ValueError, match=r"'fedact-rnu1' has no run in .*did you mean 'fedact-run1'"):
        resume_source(typo, tmp_path / "fedact-rnu1")


@pytest.mark.slow
def test_a_finished_run_continues_for_more_rounds_and_says_what_the_schedule_does(
        tmp_path, tiny_data, caplog) -> None:
    """issue 33: num-server-rounds raised on resume=true continues a finished run (rows 1-2 kept,
    round 3 added); with the cosine schedule a warning says it is recomputed; lowering is refused."""
    base = dict(model="mlp", local_steps=2, data_dir=tiny_data["fashion-mnist"], num_threads=1,
                figures=False, results_dir=str(tmp_path), run_name="grow", accept_small_rounds=True)
    first = metric_rows(run_inprocess(RunConfig.of(**base, num_server_rounds=2), 2))
    with caplog.at_level("WARNING"):
        out = run_inprocess(RunConfig.of(**base, num_server_rounds=3, resume=True), 2)
    rows = metric_rows(out)
    assert [r["round"] for r in rows] == [1, 2, 3] and rows[:2] == first
    assert "lr-schedule='cosine' is recomputed over 3 rounds" in caplog.text
    with pytest.raises(ValueError, match=r"num-server-rounds: 3 -> 2"):
        run_inprocess(RunConfig.of(**base, num_server_rounds=2, resume=True), 2)


def test_a_checkpoint_written_before_a_key_existed_resumes(tmp_path) -> None:
    """A key adaptfl gained later (lr-gamma, …) is absent from an older config.json: at its
    default it is the same job; set away from it, another one."""
    from adaptfl.server_app.checkpoint import check_same_job

    cfg = RunConfig.of(figures=False, results_dir=str(tmp_path), run_name="r", resume=True)
    run_dir = _fake_run_dir(tmp_path, cfg, server_round=2, rows=['{"round": 1}', '{"round": 2}'])
    older = {k: v for k, v in json.loads((run_dir / "config.json").read_text()).items()
             if k not in ("lr-gamma", "lr-step-every", "lr-milestones")}
    (run_dir / "config.json").write_text(json.dumps(older))
    check_same_job(cfg, run_dir)
    differs = r"run config differs \(lr-gamma: 0.1 -> 0.5, lr-schedule: 'cosine' -> 'exponential'\)"
    with pytest.raises(ValueError, match=differs):
        check_same_job(cfg.replace(lr_schedule="exponential", lr_gamma=0.5), run_dir)
