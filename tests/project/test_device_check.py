"""`scripts/device_check.sh --dry-run`: every stage of the GPU machine's check runs on the CPU
with small sizes (tiny Fashion-MNIST), so the script keeps working between the rare sessions
that have a GPU. Starts Flower processes (a simulation round, a loopback deployment round)."""

from __future__ import annotations

import subprocess

import pytest

from tests.support.flower_processes import PROJECT

pytestmark = [pytest.mark.slow, pytest.mark.flower]
STAGES = ("tests", "bench-fedact-5m", "bench-fedact-21m", "bench-muon", "bench-round", "bench-topk",
          "bench-cohort", "simulation-round", "deployment-round")


def test_the_dry_run_passes_every_stage_and_prints_one_table(tiny_data, tmp_path) -> None:
    out = tmp_path / "check"
    done = subprocess.run(["bash", str(PROJECT / "scripts" / "device_check.sh"), "--dry-run",
                           "--out", str(out), "--data", tiny_data["fashion-mnist"]],
                          capture_output=True, text=True, timeout=1800, check=False)
    table = (out / "summary.md").read_text()
    assert done.returncode == 0, table + done.stderr[-2000:]
    assert table in done.stdout  # printed as well as written
    rows = {line.split("|")[1].strip(): line.split("|")[2].strip()
            for line in table.splitlines() if line.startswith("| ") and "---" not in line}
    assert rows.pop("stage") == "status"
    assert set(rows) == set(STAGES)
    assert all(status == "ok" for status in rows.values()), rows
    for stage in STAGES:  # every stage left its log, and each figure came from it
        assert (out / f"{stage}.log").stat().st_size > 0, stage
    assert "summary cpu cnn: update" in (out / "bench-fedact-5m.log").read_text()
    assert '"flwr-run-exit": 0' in (out / "deployment-round.log").read_text()
    assert "faster than the engine" in (out / "bench-cohort.log").read_text()


def test_unknown_arguments_are_refused(tmp_path) -> None:
    done = subprocess.run(["bash", str(PROJECT / "scripts" / "device_check.sh"), "--gpu", "7"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and "unknown argument --gpu" in done.stderr
