"""FedPAC's correction reaches the client: a round-2 message's `g-g` changes the client's Δ."""

from __future__ import annotations

import pytest
import torch
from adaptfl.algorithms import wire
from adaptfl.algorithms.config import RunConfig
from adaptfl.client_app.app import handle_train
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.server_app.loop import build_strategy
from flwr.app import ArrayRecord, Context, RecordDict

from tests.conftest import needs_fashion_mnist


@needs_fashion_mnist
@pytest.mark.parametrize("optimizer", ["sophia", "muon", "soap"])
def test_g_g_changes_the_client_result(optimizer: str, tmp_path) -> None:
    cfg = RunConfig(algorithm=f"fedpac-{optimizer}", num_server_rounds=2, local_steps=2,
                    batch_size=8, model="mlp", max_precond_dim=100, muon_routing="all-2d",
                    client_state_dir=str(tmp_path))
    grid = InProcessGrid(1, cfg.to_flower())
    strategy, _ = build_strategy(cfg)
    (msg,) = strategy.configure_train(1, ArrayRecord(strategy.state.model), None, grid)
    strategy.aggregate_train(1, [handle_train(msg, grid.contexts[1])])
    (msg,) = strategy.configure_train(2, ArrayRecord(strategy.state.model), None, grid)
    assert wire.G_G in msg.content.array_records

    def delta(content: RecordDict) -> dict[str, torch.Tensor]:
        m = type(msg)(content=content, dst_node_id=1, message_type=msg.metadata.message_type)
        context = Context(run_id=1, node_id=1, node_config=dict(grid.contexts[1].node_config),
                          state=RecordDict(), run_config={})
        return handle_train(m, context).content.array_records[wire.DELTA].to_torch_state_dict()

    with_g = delta(msg.content)
    without = RecordDict({k: v for k, v in msg.content.items() if k != wire.G_G})
    assert any(not torch.equal(with_g[k], v) for k, v in delta(without).items())
