"""dp='client': a round skipped because a node failed is released as any other round (booked
at min-replies, its row carrying the same keys), so no released value tells which node failed,
nor that one did (docs/privacy.md, "What a dp run releases")."""

from __future__ import annotations

from pathlib import Path

import pytest
from flwr.app import Context, Error, Message
from flwr.common.constant import ErrorCode

from adaptfl.algorithms.config import RunConfig
from adaptfl.core import wire
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.server_app.loop import run_federated
from tests.conftest import needs_fashion_mnist
from tests.support.run_outputs import metric_rows

NODES = 3
DP_KEYS = ("dp-epsilon", "dp-noise-multiplier", "dp-epsilon-ledger")


def _rows(tiny_data, tmp_path: Path, failing: int | None) -> list[dict]:  # noqa: ANN001
    cfg = RunConfig.of(model="mlp", num_server_rounds=2, local_steps=1, batch_size=16, dp="client",
                       data_dir=tiny_data["fashion-mnist"],
                       figures=False, results_dir=str(tmp_path), weighting="uniform",
                       min_replies=NODES, max_skipped_rounds=5, run_name=f"fail-{failing}",
                       client_state_dir=str(tmp_path / "state"), dp_accept_epsilon=1e3,
                       dp_ledger=str(tmp_path / "ledger.jsonl"))  # each run its own total
    grid = InProcessGrid(NODES, cfg.to_flower())
    handler = grid.handler

    def failing_node(msg: Message, context: Context) -> Message:
        server_round = int(msg.content.config_records[wire.RECIPE]["round.server-round"])
        if context.node_id == failing and server_round == 2:  # round 1 goes through: not all skipped
            return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason="gone"), reply_to=msg)
        return handler(msg, context)

    grid.handler = failing_node
    return metric_rows(run_federated(grid, cfg))


@needs_fashion_mnist
@pytest.mark.slow
def test_a_skipped_rows_release_does_not_depend_on_which_node_failed(tiny_data, tmp_path) -> None:
    honest = _rows(tiny_data, tmp_path / "honest", None)
    first, second = _rows(tiny_data, tmp_path / "one", 1), _rows(tiny_data, tmp_path / "two", 2)
    for rows in (first, second):  # round 2 skipped: its row as the honest run's, ε booked alike
        assert len(rows) == len(honest) == 2
        for row, other in zip(rows, honest, strict=True):
            assert set(row) == set(other) and "dp-epsilon" in row, (row, other)
            assert all(row[k] == other[k] for k in DP_KEYS if k in other), (row, other)
