"""local-epochs on the client (docs/own-app.md, "Epochs"): each client runs its own
K = ceil(E·rows/batch-size) steps and reports it; the server's side is
tests/strategies/test_strategies.py (each reply divided by its own K, by hand)."""

from __future__ import annotations

import pytest
import torch

from adaptfl.algorithms.config import RunConfig
from adaptfl.client_app.client_state import MemoryStore
from adaptfl.client_app.session import ClientSession
from adaptfl.client_app.train import run_local_steps
from adaptfl.core import wire
from adaptfl.core.contract import ModelSpec, federated_state
from adaptfl.core.stage import ClientData
from adaptfl.strategies import AdaptiveStrategy
from adaptfl.workloads import build_task_model, load_task
from tests.conftest import needs_fashion_mnist


@needs_fashion_mnist
@pytest.mark.parametrize("rows,expected_k", [(37, 10), (8, 2), (3, 1)])  # ceil(2·rows/8)
def test_each_client_runs_and_reports_its_own_k(tiny_data, rows: int, expected_k: int) -> None:
    cfg = RunConfig.of(algorithm="fedact", model="mlp", data_dir=tiny_data["fashion-mnist"],
                       local_epochs=2.0, batch_size=8, local_steps=50)
    task = load_task(cfg.data.task, cfg.data.data_dir, cfg.data.model, cfg.llm)
    model = build_task_model(cfg.data.model, task, cfg.llm, cfg.data.data_dir)
    strategy = AdaptiveStrategy(cfg)
    strategy.initialize(federated_state(model), ModelSpec.of(model))
    indices = torch.arange(rows)
    data = ClientData(num_examples=rows, full_batches=lambda: [task.train.batch(indices)], loss=task.loss)
    session = ClientSession(strategy.instruction(1), model, data=data, store=MemoryStore())
    run_local_steps(session, task.train, task.loss, indices, client_id=0, warn=False)
    reply = session.reply_content(rows)
    assert session.optimizer.steps == expected_k  # not local-steps=50
    assert reply.metric_records[wire.METRICS][wire.LOCAL_STEPS] == expected_k


def test_epochs_with_what_hides_each_reply_are_refused() -> None:
    for other in (dict(dp="central", weighting="uniform"), dict(aggregator="median")):
        with pytest.raises(ValueError, match="local-epochs=1 with .* on: each reply's own K"):
            RunConfig.of(local_epochs=1.0, **other)
