"""Exact resume with stateful clients (issue 13 §2): the server is killed -9 INSIDE round 3,
after some clients have already saved their round-3 durable state; the resumed job re-runs
round 3 from the clients' round-2 state (client state is versioned by the round that wrote
it) and ends with the very model an uninterrupted run gives, bit for bit. DiLoCo's clients keep
their whole inner AdamW state (moments and step counts) the same way."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from adaptfl.algorithms.config import RunConfig
from adaptfl.engine.inprocess import run_inprocess
from tests.support.flower_processes import PROJECT
from tests.support.run_outputs import assert_same_model, completed_round, final_model, kill_when, metric_rows

# algorithm -> the name of its durable client state (DiLoCo's: its whole kept AdamW state)
STATE_NAMES = {"scaffold": "scaffold", "hafedho": "hafedho", "feddyn": "feddyn", "moon": "moon",
               "diloco": "local-state"}
NODES = 3


def _settings(algorithm: str, tiny_data: dict, tmp_path: Path, run_name: str) -> dict:
    return {"algorithm": algorithm, "model": "mlp", "num-server-rounds": 4, "local-steps": 40,
            "batch-size": 32, "num-threads": 1, "seed": 3, "data-dir": tiny_data["fashion-mnist"],
            "figures": False, "results-dir": str(tmp_path / "results"), "run-name": run_name,
            "client-state-dir": str(tmp_path / f"state-{run_name}")}


def _command(settings: dict, resume: bool) -> list[str]:
    pairs = [f"{k}={json.dumps(v)}" for k, v in settings.items()]
    return [sys.executable, "-m", "adaptfl.engine", "--num-nodes", str(NODES), *pairs,
            f"resume={'true' if resume else 'false'}"]


def _kill_inside_round_3(command: list[str], run_dir: Path, state_dir: Path, name: str) -> int:
    """SIGKILL the server as soon as one client has saved its round-3 state; returns how many
    clients had (1 or 2 of 3: inside the round)."""
    kill_when(command, PROJECT, lambda: bool(list(state_dir.glob(f"run-*/*/{name}.r3.pt"))),
              "round 3")
    assert completed_round(run_dir) == 2, "the kill must land inside round 3"
    return len(list(state_dir.glob(f"run-*/*/{name}.r3.pt")))


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", sorted(STATE_NAMES))
def test_killed_inside_round_3_then_resumed_equals_uninterrupted(algorithm: str, tiny_data,
                                                                tmp_path) -> None:
    killed = _settings(algorithm, tiny_data, tmp_path, "killed")
    run_dir = tmp_path / "results" / "killed"
    saved = _kill_inside_round_3(_command(killed, resume=False), run_dir,
                                 Path(killed["client-state-dir"]), STATE_NAMES[algorithm])
    assert 1 <= saved < NODES  # some clients had moved their state on to round 3 already

    done = subprocess.run(_command(killed, resume=True), cwd=PROJECT, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"resuming from {run_dir} after round 2" in done.stderr

    whole = _settings(algorithm, tiny_data, tmp_path, "whole")
    whole_dir = run_inprocess(RunConfig.from_flower(whole), num_nodes=NODES)
    assert_same_model(final_model(run_dir), final_model(whole_dir))
    rows, whole_rows = metric_rows(run_dir), metric_rows(whole_dir)
    assert [r["round"] for r in rows] == [1, 2, 3, 4]
    assert [r["test-accuracy"] for r in rows] == [r["test-accuracy"] for r in whole_rows]
