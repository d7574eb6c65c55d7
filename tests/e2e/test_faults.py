"""Faults: a raising client, a reply later than round-timeout, and the min-replies floor."""

from __future__ import annotations

import time

import pytest
import torch
from flwr.app import Message, RecordDict

from adaptfl.algorithms.config import RunConfig
from adaptfl.client_app.app import handle_train
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.server_app.abort import RunAborted
from adaptfl.server_app.checkpoint import STATE_FILE
from adaptfl.server_app.loop import build_run, run_federated, unanswered_nodes
from adaptfl.strategies.state import ServerState
from tests.conftest import needs_fashion_mnist
from tests.support.run_outputs import final_model, metric_rows

TIMEOUT = 1.5
SMALL = dict(model="mlp", num_server_rounds=2, local_steps=3, batch_size=32, run_name="t",
             round_timeout=TIMEOUT)


def faulty(msg, context):
    """Partition 1 raises every round; partition 2 answers later than round-timeout."""
    partition = context.node_config["partition-id"]
    if partition == 1:
        raise RuntimeError("CUDA out of memory on partition 1")
    reply = handle_train(msg, context)
    if partition == 2:
        time.sleep(TIMEOUT + 0.5)
    return reply


@pytest.mark.slow
@needs_fashion_mnist
def test_raising_and_late_clients_are_recorded_and_the_rest_aggregated(tmp_path) -> None:
    cfg = RunConfig.of(figures=False, results_dir=str(tmp_path), min_replies=2, **SMALL)
    initial = build_run(cfg)[0].state.model
    out = run_federated(InProcessGrid(4, cfg.to_flower(), handler=faulty), cfg)
    rows = metric_rows(out)
    assert [r["round"] for r in rows] == [1, 2]
    for row in rows:
        assert (row["replies-sampled"], row["replies-accepted"]) == (4, 2)
        assert (row["replies-rejected"], row["replies-missing"]) == (1, 1)
        assert row["missing"] == [3]  # node 3 holds partition 2, the late one
        assert list(row["rejected"]) == ["2"]  # node 2 holds partition 1, the raising one
        assert "CUDA out of memory on partition 1" in row["rejected"]["2"]
        assert row["skipped"] is False
    final = final_model(out)
    assert any(not torch.equal(final[n], initial[n]) for n in initial)
    # The two accepted replies per round still train the model: twice chance, and improving.
    assert rows[-1]["test-accuracy"] > 0.2 and rows[-1]["test-loss"] < rows[0]["test-loss"]


@pytest.mark.slow
@needs_fashion_mnist
def test_below_min_replies_every_round_is_skipped_and_the_model_unchanged(tmp_path) -> None:
    cfg = RunConfig.of(figures=False, results_dir=str(tmp_path), min_replies=3, **SMALL)
    initial = build_run(cfg)[0].state.model
    # Fewer rounds than max-skipped-rounds, all skipped: the run still ends non-zero, since its
    # model is the initial one, and writes no model.pt.
    with pytest.raises(RunAborted, match="all 2 rounds were skipped.*2 replies < min-replies=3"):
        run_federated(InProcessGrid(4, cfg.to_flower(), handler=faulty), cfg)
    out = tmp_path / "t"
    rows = metric_rows(out)
    assert [(r["round"], r["skipped"], r["replies-accepted"]) for r in rows] == [(1, True, 2),
                                                                                (2, True, 2)]
    assert not (out / "model.pt").exists()
    final = ServerState.load(out / STATE_FILE).model  # the checkpoint of the last round
    for name in initial:
        assert torch.equal(final[name], initial[name]), name


def _instruction(node: int, message_id: str) -> Message:
    msg = Message(content=RecordDict(), dst_node_id=node, message_type="train")
    msg.metadata.__dict__["_message_id"] = message_id
    return msg


def test_unanswered_nodes_matches_replies_by_message_id_then_by_sender() -> None:
    InProcessGrid(1, {})  # sets the task identity Flower stamps on new messages
    sent = [_instruction(node, f"id-{node}") for node in (11, 12, 13)]
    # Flower shows a vanished node's error as sent by the SuperLink (node 1): the id still matches.
    gone = Message(RecordDict(), reply_to=sent[1])
    gone.metadata.__dict__["_src_node_id"] = 1
    assert unanswered_nodes(sent, [Message(RecordDict(), reply_to=sent[0]), gone]) == [13]
    # Without ids (the in-process engine), the sender tells.
    bare = [_instruction(node, "") for node in (11, 12)]
    assert unanswered_nodes(bare, [Message(RecordDict(), reply_to=bare[1])]) == [11]
