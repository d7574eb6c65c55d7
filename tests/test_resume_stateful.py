"""Exact resume with stateful clients (issue 13 §2): the server is killed -9 INSIDE round 3,
after some clients have already saved their round-3 durable state; the resumed job re-runs
round 3 from the clients' round-2 state (client state is versioned by the round that wrote
it) and ends with the very model an uninterrupted run gives, bit for bit."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from adaptfl.algorithms.config import RunConfig
from adaptfl.engine.inprocess import run_inprocess
from adaptfl.server_app.checkpoint import STATE_FILE
from adaptfl.strategies.state import ServerState

from tests.flower_processes import PROJECT
from tests.run_outputs import assert_same_model, final_model, metric_rows

STATE_NAMES = {"scaffold": "scaffold", "hafedho": "hafedho", "feddyn": "feddyn", "moon": "moon"}
NODES = 3


def _settings(algorithm: str, tiny_data: dict, tmp_path: Path, run_name: str) -> dict:
    return {"algorithm": algorithm, "model": "mlp", "num-server-rounds": 4, "local-steps": 40,
            "batch-size": 32, "num-threads": 1, "seed": 3, "data-dir": tiny_data["fashion-mnist"],
            "results-dir": str(tmp_path / "results"), "run-name": run_name,
            "client-state-dir": str(tmp_path / f"state-{run_name}")}


def _command(settings: dict, resume: bool) -> list[str]:
    pairs = [f"{k}={json.dumps(v)}" for k, v in settings.items()]
    return [sys.executable, "-m", "adaptfl.engine", "--num-nodes", str(NODES), *pairs,
            f"resume={'true' if resume else 'false'}"]


def _round(run_dir: Path) -> int:
    try:
        return ServerState.load(run_dir / STATE_FILE).server_round
    except (FileNotFoundError, EOFError, RuntimeError):
        return 0


def _kill_inside_round_3(command: list[str], run_dir: Path, state_dir: Path, name: str) -> int:
    """SIGKILL the server as soon as one client has saved its round-3 state; returns how many
    clients had (1 or 2 of 3: inside the round)."""
    proc = subprocess.Popen(command, cwd=PROJECT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 240
        while not list(state_dir.glob(f"run-*/*/{name}.r3.pt")):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"server ended or hung before round 3: "
                                     f"{proc.stderr.read().decode()[-2000:] if proc.stderr else ''}")
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        if proc.stderr:
            proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    assert _round(run_dir) == 2, "the kill must land inside round 3"
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
