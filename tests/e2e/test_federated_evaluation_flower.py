"""Federated evaluation under `flwr run` (Flower's simulation: the ClientApp's `@app.evaluate` on
each simulated SuperNode) gives the very values the in-process engine gives: every client
evaluated on the same held-out rows, the same global and personalised scores and aggregate."""

from __future__ import annotations

import shutil

import pytest

from adaptfl.algorithms.config import RunConfig
from adaptfl.engine.inprocess import run_inprocess
from tests.conftest import needs_fashion_mnist
from tests.support.flower_processes import flwr_run_simulation, stop_local_superlink
from tests.support.run_outputs import metric_rows

pytestmark = [pytest.mark.flower, pytest.mark.slow]  # one 2-round simulation of 3 nodes (~1 min)
SETTINGS = {"num-server-rounds": 2, "local-steps": 3, "batch-size": 32, "num-threads": 1,
            "model": "mlp", "seed": 7, "fraction-evaluate": 1.0, "evaluate-local-steps": 2}
TIMED = ("fed-eval-seconds",)


def _federated(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k.startswith("fed-eval-") and k not in TIMED} for r in rows]


@needs_fashion_mnist
@pytest.mark.skipif(shutil.which("flwr") is None, reason="the flwr CLI is not installed")
def test_flwr_run_evaluates_on_the_clients_as_the_engine_does(tmp_path) -> None:
    results = tmp_path / "results"
    overrides = " ".join(f"{k}='{v}'" if isinstance(v, str) else f"{k}={v}" for k, v in SETTINGS.items())
    try:
        done = flwr_run_simulation(tmp_path / "flwr-home", 3,
                                   f"{overrides} results-dir='{results}' run-name='sim'")
    finally:
        stop_local_superlink(tmp_path / "flwr-home")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    sim = metric_rows(results / "sim")
    assert [r.get("fed-eval-replies") for r in sim] == [3, 3], done.stdout[-3000:] + done.stderr[-3000:]
    inproc = metric_rows(run_inprocess(RunConfig.from_flower(
        {**SETTINGS, "results-dir": str(results), "run-name": "inproc"}), num_nodes=3))
    # keyed by partition id: Flower's node ids are random, the engine's 1..N
    for row in (*sim, *inproc):
        for values in row["fed-eval-clients"].values():
            values.pop("node-id")
    assert _federated(sim) == _federated(inproc)
