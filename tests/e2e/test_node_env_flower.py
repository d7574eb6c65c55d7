"""Under `flwr run` (Flower's simulation, where no --node-config reaches a node) a node's owner
sets its floor in the environment of the node's process ($ADAPTFL_NODE_CONFIG,
docs/privacy.md): the simulated nodes refuse a recipe below it, naming the floor they were given."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.conftest import needs_fashion_mnist
from tests.support.flower_processes import flwr_run_simulation, stop_local_superlink

pytestmark = [pytest.mark.flower, pytest.mark.slow]  # one 1-round simulation of 2 nodes (~1 min)
SETTINGS = ("num-server-rounds=1 local-steps=1 batch-size=16 num-threads=1 model='mlp' dp='client' "
            "weighting='uniform' dp-accept-epsilon=1000.0 max-skipped-rounds=1 accept-small-rounds=true")


@needs_fashion_mnist
@pytest.mark.skipif(shutil.which("flwr") is None, reason="the flwr CLI is not installed")
def test_a_simulated_nodes_floor_comes_from_its_environment(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("ADAPTFL_NODE_CONFIG", "dp-min-noise-multiplier=5")
    results = tmp_path / "results"
    try:
        done = flwr_run_simulation(tmp_path / "flwr-home", 2,
                                   f"{SETTINGS} figures=false results-dir='{results}' run-name='env'")
    finally:
        stop_local_superlink(tmp_path / "flwr-home")
    said = done.stdout[-3000:] + done.stderr[-3000:]
    confidential = results / "env" / "server-confidential.jsonl"
    rows = [json.loads(line) for line in confidential.read_text().splitlines()]
    reasons = [why for row in rows for why in row.get("rejected", {}).values()]
    assert len(reasons) == 2, said
    assert all("dp-noise-multiplier=1 is below its dp-min-noise-multiplier=5" in why for why in reasons), said
