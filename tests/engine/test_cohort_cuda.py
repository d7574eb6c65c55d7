"""The cohort engine on CUDA against one client at a time on CUDA (float32: to round-off), run
by scripts/device_check.sh on a GPU machine; skipped where no CUDA device exists."""

from __future__ import annotations

import pytest
import torch

from adaptfl.algorithms.config import RunConfig
from adaptfl.engine.cohort import CohortGrid
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.server_app.loop import run_federated
from tests.support.run_outputs import metric_rows

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("algorithm,model", [("fedavg", "cnn"), ("fedadamw", "mlp"), ("scaffold", "mlp"),
                                             ("fedact", "mlp")])
def test_on_cuda_the_cohort_ends_on_the_one_at_a_time_model(algorithm: str, model: str, tiny_data,
                                                            tmp_path) -> None:
    def run(name: str, cohort: int | None) -> tuple[dict[str, torch.Tensor], list[dict]]:
        cfg = RunConfig.of(algorithm=algorithm, model=model, num_server_rounds=2, local_steps=3,
                           batch_size=16, device="cuda", data_dir=tiny_data["fashion-mnist"],
                           figures=False, results_dir=str(tmp_path), run_name=name, fraction_train=0.75,
                           client_state_dir=str(tmp_path / f"state-{name}"))
        grid = InProcessGrid(4, cfg.to_flower()) if cohort is None else CohortGrid(4, cfg.to_flower(), cohort)
        out = run_federated(grid, cfg)
        return torch.load(out / "model.pt", weights_only=True), metric_rows(out)

    alone, _ = run("alone", None)
    together, rows = run("cohort", 3)
    assert {r["step-path"] for r in rows} <= {"cohort-grouped", "cohort-vmap", "cohort-loop"}
    for name in alone:  # float32 round-off of a batched GEMM against per-client ones, 2 rounds
        torch.testing.assert_close(together[name], alone[name], rtol=1e-4, atol=1e-5, msg=name)
