"""Versioned broadcast records in whole in-process runs (tiny Fashion-MNIST, mlp): a frozen v̄ goes
down once per node, a node that missed rounds still holds it, the row's bytes down are the bytes
of the messages sent, the model is bit for bit the one of a run that sends everything whole, a
node that lost its state refuses one round and then gets everything whole, a node lying about
its version refuses rather than train on another copy, and a resumed server goes on as the
uninterrupted one (codec/versions.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message

from adaptfl.algorithms.config import RunConfig
from adaptfl.client_app.app import train_or_refuse
from adaptfl.codec import model_delta
from adaptfl.core import wire
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.server_app.loop import build_run, run_federated
from adaptfl.strategies import broadcast
from adaptfl.strategies.state import ServerState

pytestmark = pytest.mark.slow


def _cfg(tiny_data, tmp_path: Path, **kw) -> RunConfig:  # noqa: ANN001
    values = dict(model="mlp", algorithm="fedact", num_server_rounds=5, local_steps=2, batch_size=16,
                  data_dir=tiny_data["fashion-mnist"], figures=False, results_dir=str(tmp_path), run_name="r",
                  client_state_dir=str(tmp_path / "state"), fraction_train=1.0,
                  accept_small_rounds=True)  # two nodes: rounds of two, accepted by name
    if kw.get("algorithm", "fedact") == "fedact":  # v̄ sent once and frozen
        values.update(v_sync="full", v_sync_until=1, codec_v_bar="nf4")
    return RunConfig.of(**{**values, **kw})


class Recording:
    """The clients' handler, keeping each (instruction, reply) by round."""

    def __init__(self) -> None:
        self.pairs: list[tuple[int, Message, Message]] = []

    def __call__(self, msg: Message, context) -> Message:  # noqa: ANN001
        reply = train_or_refuse(msg, context)
        config = msg.content.config_records.get(wire.CONFIG)  # a SecAgg+ stage without training: none
        self.pairs.append((int(config["server-round"]) if config else 0, msg, reply))
        return reply

    def of_round(self, server_round: int) -> list[tuple[Message, Message]]:
        return [(m, r) for s, m, r in self.pairs if s == server_round]


def _round(strategy, grid: InProcessGrid, server_round: int) -> list[Message]:  # noqa: ANN001
    sent = list(strategy.configure_train(server_round, ArrayRecord(strategy.state.model), ConfigRecord(),
                                         grid))
    strategy.aggregate_train(server_round, list(grid.send_and_receive(sent)))
    return sent


def _bytes(messages: list[Message]) -> int:
    return sum(len(a.data) for m in messages for rec in m.content.array_records.values()
               for a in rec.values())


def _v_bar_to(sent: list[Message]) -> list[int]:
    return sorted(m.metadata.dst_node_id for m in sent if wire.V_BAR in m.content.array_records)


def test_a_frozen_v_bar_goes_down_once_per_node_and_the_rows_count_what_went(tiny_data, tmp_path) -> None:
    """Four nodes, two sampled a round: v̄ (frozen after round 1) goes to each node the first
    time it is sampled after round 1, never again, also to a node that missed rounds; each
    message names v̄'s version and nothing else's (the model and Δ_G change every round: no
    node keeps a copy of them); the row's bytes down are the messages' bytes."""
    cfg = _cfg(tiny_data, tmp_path, fraction_train=0.5, min_replies=1)
    strategy, _, _ = build_run(cfg)
    recording = Recording()
    grid = InProcessGrid(4, cfg.to_flower(), handler=recording)
    got_v_bar: set[int] = set()
    for r in range(1, 6):
        sent = _round(strategy, grid, r)
        assert strategy.report.accepted == 2, strategy.report.rejected
        nodes = {m.metadata.dst_node_id for m in sent}
        assert all(set(m.content.config_records[wire.VERSIONS]) == {wire.V_BAR} if r > 1  # none before
                   else wire.VERSIONS not in m.content.config_records for m in sent)
        expected = sorted(nodes - got_v_bar) if r > 1 else []
        assert _v_bar_to(sent) == expected, (r, got_v_bar)
        got_v_bar |= nodes if r > 1 else set()
        assert strategy.report.metrics["bytes-down"] == _bytes(sent)
        assert strategy.report.down_bytes[wire.V_BAR if r > 1 else wire.ARRAYS] == \
            sum(len(a.data) for m in sent for name, rec in m.content.array_records.items()
                for a in rec.values() if name == (wire.V_BAR if r > 1 else wire.ARRAYS))
        for msg, reply in recording.of_round(r):  # each node echoes what it now holds
            assert dict(reply.content.config_records.get(wire.VERSIONS, {})) == \
                dict(msg.content.config_records.get(wire.VERSIONS, {}))
        held = list((tmp_path / "state").rglob("held-*.pt"))
        assert {f.name.split(".")[0] for f in held} == ({f"held-{wire.V_BAR}"} if r > 1 else set())
    assert len(got_v_bar) >= 3  # some node came back after missing rounds and was not sent v̄ again


@pytest.mark.parametrize("keys", [dict(algorithm="fedavg"), dict(v_sync_until=0)], ids=["fedavg", "fedact"])
def test_records_that_change_every_round_are_neither_versioned_nor_kept(tiny_data, tmp_path, keys) -> None:
    """FedAvg's model, and FedACT's Δ_G and a v̄ synced every round, change every round: no node
    could use a copy, so none is versioned or kept (no digest, no write per message), and the
    server remembers nothing of any node."""
    cfg = _cfg(tiny_data, tmp_path, **keys)
    strategy, _, _ = build_run(cfg)
    recording = Recording()
    grid = InProcessGrid(2, cfg.to_flower(), handler=recording)
    for r in (1, 2, 3):
        sent = _round(strategy, grid, r)
        assert strategy.report.accepted == 2, strategy.report.rejected
        assert not [m for m in sent if wire.VERSIONS in m.content.config_records]
        assert all(wire.ARRAYS in m.content.array_records for m in sent)
    assert not [reply for _, _, reply in recording.pairs if wire.VERSIONS in reply.content.config_records]
    assert strategy.state.held == {} and not list((tmp_path / "state").rglob("held-*"))


def _whole_every_round(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server forgets what every node holds: everything goes whole, as before versions."""
    monkeypatch.setattr(broadcast.RoundBroadcast, "learn_held", lambda self, echoes: None)


def test_versions_change_no_number_of_the_run(tiny_data, tmp_path, monkeypatch) -> None:
    """The same run with every record whole each round ends on the same model bit for bit,
    with the same server state, and moves more bytes down (v̄ each round)."""
    cfg = _cfg(tiny_data, tmp_path / "a")
    held, _, _ = build_run(cfg)
    grid = InProcessGrid(2, cfg.to_flower())
    down = [_bytes(_round(held, grid, r)) for r in range(1, 5)]
    with monkeypatch.context() as patch:
        _whole_every_round(patch)
        whole_cfg = _cfg(tiny_data, tmp_path / "b")
        whole, _, _ = build_run(whole_cfg)
        whole_grid = InProcessGrid(2, whole_cfg.to_flower())
        whole.state.run_key = held.state.run_key
        whole_down = [_bytes(_round(whole, whole_grid, r)) for r in range(1, 5)]
    for name, t in held.state.model.items():
        assert torch.equal(t, whole.state.model[name]), name
    v_bars = held.state.extras[wire.V_BAR], whole.state.extras[wire.V_BAR]
    assert all(torch.equal(t, v_bars[1][k]) for k, t in v_bars[0].items())
    v_bar = whole_down[2] - down[2]
    assert v_bar > 0 and down[:2] == whole_down[:2] and whole_down[3] - down[3] == v_bar  # rounds 3, 4


def test_a_node_that_lost_its_state_refuses_one_round_then_gets_it_whole(tiny_data, tmp_path) -> None:
    cfg = _cfg(tiny_data, tmp_path)
    strategy, _, _ = build_run(cfg)
    recording = Recording()
    grid = InProcessGrid(2, cfg.to_flower(), handler=recording)
    for r in (1, 2, 3):
        _round(strategy, grid, r)
    assert set(strategy.state.held) == {1, 2}
    shutil.rmtree(tmp_path / "state" / f"run-{strategy.state.run_key}" / "partition-0")  # node 1's
    sent = _round(strategy, grid, 4)
    assert _v_bar_to(sent) == []  # the server believed both held it
    [(node, why)] = strategy.report.rejected.items()
    assert node == "1" and "holds none" in why and wire.V_BAR in why, why
    assert strategy.report.accepted == 1 and 1 not in strategy.state.held
    sent = _round(strategy, grid, 5)
    assert _v_bar_to(sent) == [1] and strategy.report.accepted == 2  # whole again, and it trains
    assert set(strategy.state.held) == {1, 2}


def test_a_node_claiming_a_version_it_does_not_hold_refuses_and_changes_nothing(tiny_data, tmp_path) -> None:
    """Node 1 keeps another v̄ than the one it claims (its kept copy replaced): it refuses the
    round with the version mismatch rather than train on that copy; the server state moves on
    the other reply alone, and node 1 gets v̄ whole next."""
    cfg = _cfg(tiny_data, tmp_path)
    strategy, _, _ = build_run(cfg)
    grid = InProcessGrid(2, cfg.to_flower())
    for r in (1, 2, 3):
        _round(strategy, grid, r)
    folder = tmp_path / "state" / f"run-{strategy.state.run_key}" / "partition-0"
    [kept] = sorted(folder.glob("held-v-bar.r*.pt"))
    loaded = torch.load(kept, weights_only=True)
    loaded["tensors"] = {k: t + 1.0 if t.is_floating_point() else t ^ 1 for k, t in loaded["tensors"].items()}
    torch.save(loaded, kept)
    sent = _round(strategy, grid, 4)
    assert _v_bar_to(sent) == []
    [(node, why)] = strategy.report.rejected.items()
    assert node == "1" and "kept copy" in why and "not used" in why, why
    assert strategy.report.accepted == 1 and strategy.state.server_round == 4
    assert _v_bar_to(_round(strategy, grid, 5)) == [1]


def test_a_lying_echo_is_not_kept(tiny_data, tmp_path) -> None:
    """A reply that echoes versions the server did not announce to it (another record, another
    version) leaves the server believing the node holds only what it was sent and said."""
    cfg = _cfg(tiny_data, tmp_path)
    strategy, _, _ = build_run(cfg)

    def liar(msg: Message, context) -> Message:  # noqa: ANN001
        reply = train_or_refuse(msg, context)
        if context.node_id == 1 and wire.VERSIONS in reply.content.config_records:
            echo = reply.content.config_records[wire.VERSIONS]
            echo[wire.V_BAR] = 12345
            echo[wire.SCAFFOLD_C] = 7
        return reply

    grid = InProcessGrid(2, cfg.to_flower(), handler=liar)
    for r in (1, 2):
        _round(strategy, grid, r)
    assert 1 not in strategy.state.held  # not the made-up ones: it holds nothing
    assert set(strategy.state.held[2]) == {wire.V_BAR}
    assert _v_bar_to(_round(strategy, grid, 3)) == [1]


def test_a_resumed_server_sends_what_the_uninterrupted_one_does(tiny_data, tmp_path) -> None:
    cfg = _cfg(tiny_data, tmp_path)
    whole, _, _ = build_run(cfg)
    grid = InProcessGrid(2, cfg.to_flower())
    for r in (1, 2):
        _round(whole, grid, r)
    resumed, _, _ = build_run(cfg)
    resumed.state = ServerState.from_bytes(whole.state.to_bytes())
    assert resumed.state.held == whole.state.held and whole.state.held
    for r in (3, 4):
        sent = _round(whole, InProcessGrid(2, cfg.to_flower()), r)
        again = _round(resumed, InProcessGrid(2, cfg.to_flower()), r)
        assert _v_bar_to(sent) == _v_bar_to(again) == []
        assert _bytes(sent) == _bytes(again) and resumed.report.accepted == 2
        for name, t in whole.state.model.items():
            assert torch.equal(resumed.state.model[name], t), (r, name)


def _sent_records(recording: Recording) -> dict[int, list[set[str]]]:
    """round -> the array records of each training instruction (SecAgg+'s masked-input stage)."""
    out: dict[int, list[set[str]]] = {}
    for r, msg, _ in recording.pairs:
        if wire.VERSIONS in msg.content.config_records:
            out.setdefault(r, []).append(set(msg.content.array_records))
    return out


@pytest.mark.parametrize("keys", [
    dict(secagg="secagg+", weighting="uniform", screen_ratio=0, max_contribution_ratio=0),
    dict(dp="central", weighting="uniform", dp_target_epsilon=50.0, total_examples=600, dp_seed=7,
         dp_testing_reproducible_noise=True),
], ids=["secagg+", "dp"])
def test_under_secagg_and_dp_a_static_record_goes_once_and_the_state_is_the_whole_runs(
        tiny_data, tmp_path, monkeypatch, keys) -> None:  # noqa: ANN001
    """HaFedHo's |D| (n-total) does not change over a run: it goes down in round 2 only (the
    first with records to share), the model as a delta from round 2, the
    replies (masked ones too) echo it, and the run ends on the state of the run that sends
    everything whole, bit for bit."""
    cfg = _cfg(tiny_data, tmp_path / "held", algorithm="hafedho", num_server_rounds=3, model_delta="xor",
               **keys)
    recording = Recording()
    held = ServerState.load(run_federated(InProcessGrid(3, cfg.to_flower(), handler=recording), cfg)
                            / "state.pt")
    sent = _sent_records(recording)
    assert [sum(wire.HAFEDHO_N_TOTAL in s for s in sent[r]) for r in (1, 2, 3)] == [0, 3, 0], sent
    # the model changes every round: whole in round 1, then as its delta against the node's
    assert all((wire.ARRAYS in s) == (r == 1) == (wire.ARRAYS_DELTA not in s) for r in sent for s in sent[r])
    assert set(held.held) == {1, 2, 3} and all(wire.HAFEDHO_N_TOTAL in v for v in held.held.values())
    _whole_every_round(monkeypatch)
    whole_cfg = cfg.replace(figures=False, results_dir=str(tmp_path / "whole"),
                            client_state_dir=str(tmp_path / "whole-state"))
    whole = ServerState.load(run_federated(InProcessGrid(3, whole_cfg.to_flower()), whole_cfg) / "state.pt")
    assert whole.held == {}
    for name, t in whole.model.items():
        assert torch.equal(held.model[name], t), name


@pytest.mark.parametrize("how", ["xor", "diff"])
def test_the_model_goes_as_a_lossless_delta_and_the_run_is_the_whole_runs(tiny_data, tmp_path, how) -> None:
    """model-delta='xor' / 'diff': from round 2 each node gets the model as its delta against the
    one it holds, fewer bytes; the run ends on the model of the run without it, bit for bit; the
    rows count what went; a resumed server keeps the models it deltas against."""
    cfg = _cfg(tiny_data, tmp_path / "delta", model_delta=how)
    delta, _, _ = build_run(cfg)
    grid = InProcessGrid(2, cfg.to_flower())
    plain_cfg = _cfg(tiny_data, tmp_path / "plain")
    plain, _, _ = build_run(plain_cfg)
    plain_grid = InProcessGrid(2, plain_cfg.to_flower())
    for r in range(1, 5):
        if r == 3:  # resumed mid-run: the state (kept models too) through its bytes
            saved = delta.state.to_bytes()
            delta, _, _ = build_run(cfg)
            delta.state = ServerState.from_bytes(saved)
            assert len(delta.state.kept_models) == 2
        sent = _round(delta, grid, r)
        _round(plain, plain_grid, r)
        assert delta.report.accepted == 2, delta.report.rejected
        records = [set(m.content.array_records) for m in sent]
        assert all((wire.ARRAYS_DELTA in s) == (r > 1) and (wire.ARRAYS in s) == (r == 1) for s in records)
        assert delta.report.metrics["bytes-down"] == _bytes(sent)
        if r > 1:
            assert delta.report.down_bytes[wire.ARRAYS_DELTA] < 0.95 * plain.report.down_bytes[wire.ARRAYS]
            assert all(set(m.content.array_records[wire.ARRAYS_DELTA]) == {model_delta.BLOBS[how]}
                       for m in sent)
        for name, t in plain.state.model.items():
            assert torch.equal(delta.state.model[name], t), (r, name)
    assert plain.state.kept_models == {}


def test_a_node_that_lost_the_model_a_delta_needs_refuses_then_gets_it_whole(tiny_data, tmp_path) -> None:
    cfg = _cfg(tiny_data, tmp_path, model_delta="xor")
    strategy, _, _ = build_run(cfg)
    grid = InProcessGrid(2, cfg.to_flower())
    for r in (1, 2):
        _round(strategy, grid, r)
    shutil.rmtree(tmp_path / "state" / f"run-{strategy.state.run_key}" / "partition-1")  # node 2's
    _round(strategy, grid, 3)
    [(node, why)] = strategy.report.rejected.items()
    assert node == "2" and "holds none" in why and wire.ARRAYS in why, why
    sent = {m.metadata.dst_node_id: set(m.content.array_records) for m in _round(strategy, grid, 4)}
    assert wire.ARRAYS in sent[2] and wire.V_BAR in sent[2] and wire.ARRAYS_DELTA in sent[1]
    assert strategy.report.accepted == 2
