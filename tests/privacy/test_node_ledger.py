"""A node's own ledger (privacy/node_ledger.py) against a server that asks again: a replayed
training instruction, a second SecAgg+ round for a round, a layout that lists an entry twice or
out of order, federated evaluation under dp='client', or a request past the node's budget; each
gets a refusal naming why, never a second noised copy of an update (docs/privacy.md, "A node's
own ledger"). Whole in-process runs (mlp, 3 nodes, tiny Fashion-MNIST) played by a server that
rewrites what it sends."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from flwr.app import Context, Message, RecordDict

from adaptfl.algorithms.config import RunConfig
from adaptfl.client_app import app
from adaptfl.core import wire
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.privacy import node_ledger
from adaptfl.privacy.client import NodeFloor, node_budget
from adaptfl.privacy.node_ledger import Budget, Release
from adaptfl.secagg import aggregate, fixedpoint
from adaptfl.server_app import loop
from adaptfl.server_app.abort import RunAborted
from adaptfl.server_app.loop import run_federated

NODES = 3
# HaFedHo under dp: |D| declared, not counted from the replies
ALGORITHMS: dict[str, dict[str, Any]] = {"fedavg": {"algorithm": "fedavg"}, "fedact": {"algorithm": "fedact"},
                                         "hafedho": {"algorithm": "hafedho", "total_examples": 600}}
CARRIES = (wire.DELTA, wire.MASKED)


def _cfg(tiny_data, tmp_path: Path, **kw: Any) -> RunConfig:  # noqa: ANN001
    values = dict(model="mlp", num_server_rounds=1, local_steps=1, batch_size=16, dp="client",
                  data_dir=tiny_data["fashion-mnist"],
                  figures=False, results_dir=str(tmp_path), weighting="uniform",
                  screen_ratio=0, max_contribution_ratio=0, max_skipped_rounds=5, run_name="replay",
                  client_state_dir=str(tmp_path / "state"), dp_accept_epsilon=1e3)
    return RunConfig.of(**{**values, **kw})


def _run(cfg: RunConfig, node_config: dict[str, Any] | None = None
         ) -> tuple[InProcessGrid, list[tuple[Message, Context, Message]]]:
    """The grid and every (instruction, node context, reply) of the run."""
    grid = InProcessGrid(NODES, cfg.to_flower())
    for context in grid.contexts.values():
        context.node_config.update(node_config or {})
    seen: list[tuple[Message, Context, Message]] = []
    handler = grid.handler

    def spy(msg: Message, context: Context) -> Message:
        content = RecordDict(dict(msg.content.items()))  # the masked input deletes its secagg record
        reply = handler(msg, context)
        seen.append((Message(content, dst_node_id=msg.metadata.dst_node_id,
                             message_type=msg.metadata.message_type), context, reply))
        return reply

    grid.handler = spy
    try:
        run_federated(grid, cfg)
    except RunAborted:
        pass
    return grid, seen


def _carrying(replies: list[Message]) -> list[Message]:
    return [r for r in replies if not r.has_error() and any(k in r.content.array_records for k in CARRIES)]


def _reasons(replies: list[Message]) -> list[str]:
    return [r.error.reason for r in replies if r.has_error()]


# --- the ledger alone ------------------------------------------------------------------------
def test_a_round_is_booked_once_and_the_budget_binds(tmp_path) -> None:
    path, budget = tmp_path / "node.jsonl", Budget(max_epsilon=30.0, delta=1e-5)
    first = node_ledger.book(path, Release("run", 1, "train", 0.5), budget)
    assert first == pytest.approx(25.93, abs=0.01)  # one Gaussian at z/2 = 0.25, no amplification
    with pytest.raises(ValueError, match="round 1 of run 'run' .train. was answered already"):
        node_ledger.book(path, Release("run", 1, "train", 0.5), budget)
    with pytest.raises(ValueError, match=r"ε=41.6.* past its dp-node-max-epsilon=30 \(1 releases") as past:
        node_ledger.book(path, Release("other-run", 1, "train", 0.5), budget)
    assert past.value.args[0].endswith("ask for more noise, or the node's owner raises dp-node-max-epsilon "
                                       "(node config, or $ADAPTFL_NODE_CONFIG where none reaches the node) "
                                       "to accept more")  # what to do
    assert node_ledger.read(path) == [Release("run", 1, "train", 0.5)]  # refusals book nothing
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    path.write_text(path.read_text() + "{not json\n")
    with pytest.raises(ValueError, match="line 2 is not a release"):
        node_ledger.book(path, Release("run", 2, "train", 0.5), budget)


def test_the_node_budget_keys_are_read_from_node_config() -> None:
    assert node_budget({}) == Budget(1000.0, 1e-5)
    assert node_budget({"dp-node-max-epsilon": "12", "dp-node-delta": 1e-6}) == Budget(12.0, 1e-6)
    with pytest.raises(ValueError, match="node config dp-node-delta=2 must be below 1"):
        node_budget({"dp-node-delta": 2})
    with pytest.raises(ValueError, match="dp-node-max-epsilon='x' must be a number > 0"):
        node_budget({"dp-node-max-epsilon": "x"})
    assert not NodeFloor.of({"dp-node-max-epsilon": 5}).dp_required  # a budget is not a floor


# --- a server that asks again ----------------------------------------------------------------
@pytest.mark.parametrize("restarted", [False, True])
def test_a_replayed_training_instruction_is_refused(restarted: bool, tiny_data, tmp_path) -> None:
    """The same instruction again, to the same node (restarted: a fresh context, as a SuperNode
    that lost its memory): refused from the ledger on disk, no second Δ."""
    grid, seen = _run(_cfg(tiny_data, tmp_path))
    assert len(_carrying([r for _, _, r in seen])) == NODES
    replies = []
    for msg, context, _ in seen:
        if restarted:
            context = Context(context.run_id, context.node_id, dict(context.node_config), RecordDict(),
                              context.run_config)
        replies.append(app.answer(msg, context))
    assert _carrying(replies) == []
    assert len(_reasons(replies)) == NODES
    assert all("round 1 of run" in why and "answered already" in why and "\n" not in why
               for why in _reasons(replies))


@pytest.mark.slow
def test_the_ledger_books_every_reply_and_refuses_past_its_budget(tiny_data, tmp_path) -> None:
    """z=1, n=3: each reply at 1/√3 is ε 21.5; a budget of 30 takes round 1, refuses round 2."""
    _, seen = _run(_cfg(tiny_data, tmp_path, num_server_rounds=2, run_name="budget"),
                   {"dp-node-max-epsilon": 30})
    by_round: dict[int, list[Message]] = {}
    for msg, _, reply in seen:
        server_round = int(msg.content.config_records[wire.RECIPE]["round.server-round"])
        by_round.setdefault(server_round, []).append(reply)
    assert len(_carrying(by_round[1])) == NODES
    booked = [line for f in sorted(Path(os.environ["ADAPTFL_LEDGER_DIR"]).glob("node-*.jsonl"))
              for line in f.read_text().splitlines()]
    assert len(booked) == NODES  # once each, before training (not again at the reply)
    assert _carrying(by_round[2]) == []
    assert all("past its dp-node-max-epsilon=30" in why for why in _reasons(by_round[2]))


def test_secagg_twice_in_a_round_is_refused(tiny_data, tmp_path, monkeypatch) -> None:
    """A server running SecAgg+ a second time for round 1: every node refuses the second setup
    (were its memory lost, the second masked input's training would meet its ledger, as the
    replay test shows for plain training)."""
    real = aggregate.secure_round
    seen: list[Message] = []
    second: list[Message] = []

    def twice(strategy, grid, server_round, messages, timeout):  # noqa: ANN001, ANN202
        real(strategy, grid, server_round, messages, timeout)
        start = len(seen)
        out = real(strategy, grid, server_round, messages, timeout)
        second.extend(seen[start:])
        return out

    monkeypatch.setattr(loop, "secure_round", twice)
    cfg = _cfg(tiny_data, tmp_path, secagg="secagg+", min_replies=NODES)
    grid = InProcessGrid(NODES, cfg.to_flower())
    handler = grid.handler

    def spy(msg: Message, context: Context) -> Message:
        reply = handler(msg, context)
        seen.append(reply)
        return reply

    grid.handler = spy
    try:
        run_federated(grid, cfg)
    except RunAborted:
        pass
    assert len(_carrying(seen)) == NODES  # the first SecAgg+ round's only
    assert _carrying(second) == [] and len(_reasons(second)) == NODES
    assert all("round 1 was masked already" in why for why in _reasons(second))


def _lying_layout(monkeypatch, change) -> None:  # noqa: ANN001
    real = fixedpoint.layout
    monkeypatch.setattr(aggregate.fixedpoint, "layout", lambda *a, **k: change(real(*a, **k)))


LAYOUTS = {
    "each entry twice": (lambda s: [x for slot in s for x in (slot, slot)], "more than once"),
    "reversed": (lambda s: s[::-1], "in another order"),
    "one left out": (lambda s: s[1:], "lacks"),
    "another name": (lambda s: [dataclasses.replace(s[0], name="extra"), *s[1:]], "lacks"),
}


@pytest.mark.parametrize("lie", sorted(LAYOUTS))
def test_a_layout_other_than_the_contract_is_refused(lie: str, tiny_data, tmp_path, monkeypatch) -> None:
    change, says = LAYOUTS[lie]
    _lying_layout(monkeypatch, change)
    _, seen = _run(_cfg(tiny_data, tmp_path, secagg="secagg+", algorithm="fedact"))
    replies = [r for _, _, r in seen]
    assert _carrying(replies) == []
    why = _reasons(replies)
    assert len(why) == NODES, why
    assert all(says in w and "secagg: the layout" in w and "\n" not in w for w in why), why


@pytest.mark.slow
def test_the_nodes_layout_is_the_servers_for_every_algorithm(tiny_data, tmp_path) -> None:
    """The honest layout is answered (fedact shares Δ and v; hafedho a metric too)."""
    for algorithm in ("fedact", "hafedho"):
        _, seen = _run(_cfg(tiny_data, tmp_path / algorithm, secagg="secagg+", **ALGORITHMS[algorithm]))
        replies = [r for _, _, r in seen]
        assert _reasons(replies) == [] and len(_carrying(replies)) == NODES, algorithm


def test_evaluation_under_dp_client_is_refused_by_the_node_and_the_config(tiny_data, tmp_path) -> None:
    _, seen = _run(_cfg(tiny_data, tmp_path))
    msg, context, _ = seen[0]
    asked = Message(msg.content, dst_node_id=msg.metadata.dst_node_id, message_type="evaluate")
    reply = app.answer(asked, context)
    assert reply.has_error() and "federated evaluation under dp='client'" in reply.error.reason
    with pytest.raises(ValueError, match="dp='client' with fraction-evaluate=1: nodes do not answer"):
        _cfg(tiny_data, tmp_path, fraction_evaluate=1.0)


@pytest.mark.parametrize("algorithm", ["fedavg", "hafedho"])
def test_removing_one_training_row_moves_no_value_a_node_returns_bare(algorithm: str, tiny_data, tmp_path,
                                                                      monkeypatch) -> None:
    """The distinguisher of a bare train-loss: the same instruction to the same node with its
    rows and with one row fewer; every metric of the reply is the same but the noised ones."""
    from adaptfl.privacy.reply_metrics import SENT

    _, seen = _run(_cfg(tiny_data, tmp_path, **ALGORITHMS[algorithm]))
    msg, context, _ = seen[0]
    real = app._partition

    def reply(drop: bool) -> dict[str, Any]:
        def partition(*args: Any) -> tuple[Any, int]:
            rows, pid = real(*args)
            return (rows[:-1] if drop else rows), pid

        monkeypatch.setattr(app, "_partition", partition)
        ledger = tmp_path / f"ledger-{drop}.jsonl"  # each its own: the round is booked once
        ctx = Context(context.run_id, context.node_id, {**context.node_config, "dp-node-ledger": str(ledger)},
                      RecordDict(), context.run_config)
        out = app.answer(msg, ctx)
        assert not out.has_error(), out.error.reason
        return dict(out.content.metric_records[wire.METRICS])

    whole, fewer = reply(False), reply(True)
    noised = {wire.F_HAT} if algorithm == "hafedho" else set()
    assert set(whole) == set(fewer) and set(whole) <= SENT | noised | {wire.NUM_EXAMPLES}, sorted(whole)
    assert whole[wire.NUM_EXAMPLES] == 1
    bare = [k for k in whole if k not in noised]
    assert [whole[k] for k in bare] == [fewer[k] for k in bare]


def test_nodes_whose_labels_coincide_keep_ledgers_of_their_own() -> None:
    """Two partitions of one class each, the same count: their own rows name their ledgers."""
    from adaptfl.privacy.node_ledger import rows_key

    labels = torch.zeros(8, dtype=torch.int64)
    first, second = rows_key("t", labels, torch.arange(4)), rows_key("t", labels, torch.arange(4, 8))
    assert first != second and first == rows_key("t", labels, torch.arange(4))


def test_a_clientapp_of_ones_own_books_at_the_reply(tiny_data, tmp_path) -> None:
    """A session adaptfl's ClientApp did not book (a ClientApp of one's own builds it) is booked
    when its reply is made: a second session for the round is refused there."""
    from adaptfl.client_app.session import ClientSession

    _, seen = _run(_cfg(tiny_data, tmp_path))
    msg, context, _ = seen[0]
    model = app.prepare_train(msg, _with_ledger(context, tmp_path / "adaptfl.jsonl")).session.model
    own = _with_ledger(context, tmp_path / "own.jsonl")
    first = ClientSession(msg, model, context=own)
    assert not first.booking.booked
    first.reply_content(num_examples=1, check_steps=False)
    assert first.booking.booked and len(node_ledger.read(tmp_path / "own.jsonl")) == 1
    with pytest.raises(ValueError, match="answered already"):
        ClientSession(msg, model, context=own).reply_content(num_examples=1, check_steps=False)


def _with_ledger(context: Context, path: Path) -> Context:
    return Context(context.run_id, context.node_id, {**context.node_config, "dp-node-ledger": str(path)},
                   RecordDict(), context.run_config)


def test_a_node_owner_sets_its_keys_in_its_environment(tiny_data, tmp_path, monkeypatch) -> None:
    """$ADAPTFL_NODE_CONFIG: the floor, cap and budget where no --node-config reaches a node
    (Flower's simulation); a key of the node config wins; an unknown key is one line."""
    from adaptfl.privacy.client import NODE_CONFIG_ENV, node_settings

    monkeypatch.setenv(NODE_CONFIG_ENV, "dp-min-noise-multiplier=5 secagg-required=true")
    assert node_settings({"partition-id": 0, "secagg-required": "false"}) == {
        "dp-min-noise-multiplier": "5", "secagg-required": "false", "partition-id": 0}
    monkeypatch.setenv(NODE_CONFIG_ENV, "dp-min-noise-multiplier=5")
    _, seen = _run(_cfg(tiny_data, tmp_path))
    replies = [r for _, _, r in seen]
    assert _carrying(replies) == [] and len(_reasons(replies)) == NODES
    assert all("dp-noise-multiplier=1 is below its dp-min-noise-multiplier=5" in w for w in _reasons(replies))
    monkeypatch.setenv(NODE_CONFIG_ENV, "dp-max-cohrt=3")
    with pytest.raises(ValueError, match=r"NODE_CONFIG: 'dp-max-cohrt=3' is not key=value of a node key"):
        node_settings({})


def test_a_resumed_server_rerunning_a_round_is_refused_and_books_nothing_twice(tiny_data, tmp_path,
                                                                               monkeypatch) -> None:
    """Killed after round 2's replies, before its checkpoint: the resumed run asks round 2 again
    under the same run key; every node answered it already (its ledger on disk), so it refuses,
    and each node's ledger holds rounds 1 and 2 once."""
    from tests.support.run_outputs import die_before_checkpoint

    cfg = _cfg(tiny_data, tmp_path, num_server_rounds=2, run_name="resumed")
    with monkeypatch.context() as m:
        die_before_checkpoint(m, 2)
        with pytest.raises(KeyboardInterrupt):
            _run(cfg)
    _, seen = _run(cfg.replace(resume=True))
    replies = [r for _, _, r in seen]
    assert _carrying(replies) == [] and len(_reasons(replies)) == NODES
    assert all("round 2 of run" in why and "answered already" in why for why in _reasons(replies))
    ledgers = sorted(Path(os.environ["ADAPTFL_LEDGER_DIR"]).glob("node-*.jsonl"))
    assert len(ledgers) == NODES
    assert all(sorted(r.round for r in node_ledger.read(f)) == [1, 2] for f in ledgers)


def test_the_docs_reply_value_table_is_generated_from_the_declaration() -> None:
    from adaptfl.privacy.reply_metrics import reply_table

    text = (Path(__file__).resolve().parents[2] / "docs" / "privacy.md").read_text()
    assert reply_table() in text, "stale: run python scripts/regenerate_docs.py"
