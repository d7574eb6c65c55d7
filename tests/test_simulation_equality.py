"""`flwr run` simulation and the in-process engine give the identical global model."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from algorithms.config import RunConfig
from engine.inprocess import run_inprocess
from tests.conftest import needs_fashion_mnist
from tests.flower_processes import flwr_run_simulation, stop_local_superlink

SETTINGS = {"num-server-rounds": 2, "local-steps": 3, "batch-size": 32, "num-threads": 1,
            "dirichlet-alpha": 0.3, "seed": 7}


@pytest.mark.flower
@needs_fashion_mnist
@pytest.mark.skipif(shutil.which("flwr") is None, reason="the flwr CLI is not installed")
def test_two_rounds_of_fedact_match_between_simulation_and_in_process(tmp_path) -> None:
    results = tmp_path / "results"
    overrides = " ".join(f"{k}={v}" for k, v in SETTINGS.items())
    run_config = f"{overrides} results-dir='{results}' run-name='sim' algorithm='fedact'"
    try:
        done = flwr_run_simulation(tmp_path / "flwr-home", 3, run_config)
    finally:
        stop_local_superlink(tmp_path / "flwr-home")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    sim_dir = results / "sim"
    assert (sim_dir / "model.pt").exists(), done.stdout[-3000:]

    cfg = RunConfig.from_flower({**RunConfig().to_flower(), **SETTINGS,
                                 "results-dir": str(results), "run-name": "inproc"})
    torch.set_num_threads(1)
    inproc_dir = run_inprocess(cfg, num_nodes=3)

    sim_model = torch.load(sim_dir / "model.pt", weights_only=True)
    inproc_model = torch.load(inproc_dir / "model.pt", weights_only=True)
    assert sim_model.keys() == inproc_model.keys()
    for name in sim_model:
        assert torch.equal(sim_model[name], inproc_model[name]), name
    sim_rows = [json.loads(line) for line in (sim_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["replies-accepted"] for r in sim_rows] == [3, 3]
    assert sim_rows[-1]["test-accuracy"] > 0.3
