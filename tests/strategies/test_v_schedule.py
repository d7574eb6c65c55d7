"""FedACT's v need not travel every round (v-sync-every, v-sync-until; algorithms/components/
moments.py): which rounds' replies carry v, by hand; on the in-process engine, the replies of
the other rounds carry no v record, the server keeps its v̄ bit for bit and every client decodes
exactly the server's v̄; a v sent in a round without v is refused with the state unchanged; the
rows' bytes up are Δ's alone then; and a run resumed mid-schedule goes on as the uninterrupted
one does."""

from __future__ import annotations

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message

from adaptfl.algorithms.config import RunConfig
from adaptfl.client_app.app import train_or_refuse
from adaptfl.core import wire
from adaptfl.core.contract import ModelSpec
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.server_app.loop import build_run, run_federated
from adaptfl.strategies.state import ServerState
from tests.support.decoded import Decoded, record_decoded
from tests.support.run_outputs import metric_rows


def _cfg(tiny_data, tmp_path, **kw) -> RunConfig:  # noqa: ANN001
    values = dict(model="mlp", algorithm="fedact", num_server_rounds=4, local_steps=2, batch_size=16,
                  data_dir=tiny_data["fashion-mnist"], figures=False, results_dir=str(tmp_path), run_name="r",
                  fraction_train=1.0, accept_small_rounds=True)  # two nodes a round
    return RunConfig.of(**{**values, **kw})


@pytest.mark.parametrize("keys,rounds", [
    ({}, [1, 2, 3, 4, 5, 6, 7]),
    ({"v_sync_every": 3}, [1, 4, 7]),
    ({"v_sync_until": 2}, [1, 2]),
    ({"v_sync_every": 2, "v_sync_until": 5}, [1, 3, 5]),
    ({"v_sync": "block", "v_sync_every": 4}, [1, 5]),
])
def test_the_rounds_whose_replies_carry_v(keys, rounds) -> None:  # noqa: ANN001
    algorithm = RunConfig.of(algorithm="fedact", **keys).algorithm
    assert [r for r in range(1, 8) if algorithm.moments.uploads_on(r)] == rounds
    assert algorithm.skips_uploads() == bool(keys.get("v_sync_every", 1) > 1 or "v_sync_until" in keys)
    spec = ModelSpec.of(torch.nn.Linear(3, 2))
    assert [r for r in range(1, 8) if wire.V_LOCAL in algorithm.contract(spec, r).up] == rounds
    assert wire.V_LOCAL in algorithm.contract(spec).up  # the declaration: every record any round carries


@pytest.mark.parametrize("keys,message", [
    ({"v_sync_every": 0}, "invalid v-sync-every=0: must be >= 1"),
    ({"v_sync_every": -2}, "invalid v-sync-every=-2: must be >= 1"),
    ({"v_sync_until": -1}, "invalid v-sync-until=-1: must be >= 0"),
    ({"v_sync": "none", "v_sync_every": 2}, "run-config key ['v-sync-every'] not used by algorithm"),
    ({"algorithm": "fedavg", "v_sync_until": 3}, "run-config key ['v-sync-until'] not used by algorithm"),
    ({"v_sync_every": 2, "dp": "central", "weighting": "uniform", "dp_target_epsilon": 8.0},
     "v-sync-every=2 v-sync-until=0 with dp on"),
    ({"v_sync_until": 2, "secagg": "secagg+"}, "v-sync-every=1 v-sync-until=2 with secagg on"),
])
def test_bad_schedules_are_refused_in_one_line(keys, message) -> None:  # noqa: ANN001
    with pytest.raises(ValueError) as err:
        RunConfig.of(**{"algorithm": "fedact", **keys})
    assert message in str(err.value) and "\n" not in str(err.value)


class Recording:
    """The clients' handler, keeping each reply; `extra_v`: in the rounds named, the first reply
    gets a v record (its Δ's magnitudes: a well-formed v of the right shapes)."""

    def __init__(self, extra_v: tuple[int, ...] = ()) -> None:
        self.replies: list[tuple[int, Message]] = []
        self.extra_v = extra_v

    def __call__(self, msg: Message, context) -> Message:  # noqa: ANN001
        reply = train_or_refuse(msg, context)
        server_round = int(msg.content.config_records[wire.CONFIG]["server-round"])
        if server_round in self.extra_v and not self.of_round(server_round):
            delta = reply.content.array_records[wire.DELTA].to_torch_state_dict()
            reply.content[wire.V_LOCAL] = ArrayRecord({n: t.abs() for n, t in delta.items()})
        self.replies.append((server_round, reply))
        return reply

    def of_round(self, server_round: int) -> list[Message]:
        return [reply for s, reply in self.replies if s == server_round]


@pytest.fixture
def decoded_by_clients(monkeypatch) -> list[Decoded]:  # noqa: ANN001
    """Each client session's decoded v̄ (one entry per session that got one)."""
    def v_bar(seen: list[Decoded], name: str, record: dict[str, torch.Tensor]) -> None:
        if name == wire.V_BAR:
            seen.append({name: record})
    return record_decoded(monkeypatch, v_bar)


def _round(strategy, grid: InProcessGrid, server_round: int) -> list[Message]:  # noqa: ANN001
    sent = strategy.configure_train(server_round, ArrayRecord(strategy.state.model), ConfigRecord(), grid)
    replies = list(grid.send_and_receive(sent))
    assert not any(r.has_error() for r in replies), [r.error.reason for r in replies if r.has_error()]
    strategy.aggregate_train(server_round, replies)
    return sent


def _v_bar(strategy) -> dict[str, torch.Tensor]:  # noqa: ANN001
    return {k: t.clone() for k, t in strategy.state.extras[wire.V_BAR].items()}


def _bitwise(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k].cpu().view(torch.int32), b[k].view(torch.int32))
                                        for k in a)


@pytest.mark.parametrize("keys,uploads", [
    (dict(v_sync_every=2), (1, 3)),
    (dict(v_sync_until=1), (1,)),
    (dict(v_sync_every=3, codec_v_bar="nf4", codec_rounding="stochastic"), (1, 4)),
    (dict(v_sync="block", v_sync_every=2, codec_v="int8"), (1, 3)),
    (dict(v_sync_until=2, codec_v_bar="top50%:nf4"), (1, 2)),
])
def test_rounds_without_v_keep_the_servers_state_and_the_clients_decode_it(
        tiny_data, tmp_path, decoded_by_clients, keys, uploads) -> None:  # noqa: ANN001
    recording = Recording()
    cfg = _cfg(tiny_data, tmp_path, **keys)
    strategy, _, _ = build_run(cfg)
    grid = InProcessGrid(2, cfg.to_flower(), handler=recording)
    kept: dict[str, torch.Tensor] = {}
    for r in range(1, 5):
        decoded_by_clients.clear()
        sent = _round(strategy, grid, r)
        assert strategy.report.accepted == 2, strategy.report.rejected
        carried = [wire.V_LOCAL in reply.content.array_records for reply in recording.of_round(r)]
        assert carried == [r in uploads] * 2
        # v̄'s bytes go down when it is new to the nodes: round 2, and after each round with v
        assert (wire.V_BAR in sent[0].content.array_records) == (r == 2 or r - 1 in uploads[1:])
        if r > 1:  # each client warm-starts from exactly the v̄ the server keeps
            assert len(decoded_by_clients) == 2
            assert all(_bitwise(c[wire.V_BAR], kept) for c in decoded_by_clients)
        now = _v_bar(strategy)
        assert _bitwise(now, kept) == (r not in uploads), r  # renewed in the rounds with v only
        kept = now
        up = strategy.report.metrics["bytes-up"]
        delta_bytes = sum(len(a.data) for reply in recording.of_round(r)
                          for a in reply.content.array_records[wire.DELTA].values())
        assert (up == delta_bytes) == (r not in uploads)


def test_a_v_sent_in_a_round_without_v_is_refused_and_changes_nothing(tiny_data, tmp_path) -> None:
    recording = Recording(extra_v=(2,))
    cfg = _cfg(tiny_data, tmp_path, v_sync_every=2, num_server_rounds=2)
    strategy, _, _ = build_run(cfg)
    grid = InProcessGrid(2, cfg.to_flower(), handler=recording)
    _round(strategy, grid, 1)
    before = _v_bar(strategy)
    _round(strategy, grid, 2)
    assert strategy.report.accepted == 1
    [(node, why)] = strategy.report.rejected.items()
    assert "array records" in why and wire.V_LOCAL in why, why
    assert _bitwise(_v_bar(strategy), before)
    assert strategy.state.server_round == 2  # the round ran on the other reply


@pytest.mark.slow
def test_the_rows_bytes_up_are_deltas_alone_in_rounds_without_v(tiny_data, tmp_path) -> None:
    every_cfg, plain_cfg = _cfg(tiny_data, tmp_path / "a", v_sync_every=3), _cfg(tiny_data, tmp_path / "b")
    every = metric_rows(run_federated(InProcessGrid(2, every_cfg.to_flower()), every_cfg))
    plain = metric_rows(run_federated(InProcessGrid(2, plain_cfg.to_flower()), plain_cfg))
    for r, (row, full) in enumerate(zip(every, plain, strict=True), start=1):
        assert set(full["bytes"]["up"]) == {wire.DELTA, wire.V_LOCAL}
        assert set(row["bytes"]["up"]) == ({wire.DELTA, wire.V_LOCAL} if r in (1, 4) else {wire.DELTA})
        assert row["bytes"]["up"][wire.DELTA] == full["bytes"]["up"][wire.DELTA]
        assert row["bytes-up"] == sum(row["bytes"]["up"].values())
        v_bar = full["bytes"]["down"][wire.V_BAR] if r in (3, 4) else 0  # nodes hold it (versions)
        assert row["bytes-down"] == full["bytes-down"] - v_bar, r
    assert sum(r["bytes-up"] for r in every) == sum(r["bytes-up"] for r in plain) - \
        2 * plain[0]["bytes"]["up"][wire.V_LOCAL]  # rounds 2 and 3 saved v's bytes


def test_a_resumed_server_goes_on_mid_schedule_as_the_uninterrupted_one(tiny_data, tmp_path) -> None:
    """every=3: v in rounds 1 and 4. The server's state after round 2 (mid-schedule) restored into
    a fresh strategy gives the same instructions, replies and state in rounds 3 and 4."""
    cfg = _cfg(tiny_data, tmp_path, v_sync_every=3)
    whole, _, _ = build_run(cfg)
    grid = InProcessGrid(2, cfg.to_flower())
    for r in (1, 2):
        _round(whole, grid, r)
    saved = whole.state.to_bytes()
    resumed, _, _ = build_run(cfg)
    resumed.state = ServerState.from_bytes(saved)
    for r in (3, 4):
        sent = [_arrays(m) for m in _round(whole, InProcessGrid(2, cfg.to_flower()), r)]
        again = [_arrays(m) for m in _round(resumed, InProcessGrid(2, cfg.to_flower()), r)]
        assert sent == again, r
        assert _bitwise(_v_bar(resumed), _v_bar(whole))
        for name, t in whole.state.model.items():
            assert torch.equal(resumed.state.model[name], t), (r, name)
        assert resumed.report.metrics["bytes-up"] == whole.report.metrics["bytes-up"]


def _arrays(msg: Message) -> dict[str, dict[str, bytes]]:
    return {name: {k: a.data for k, a in rec.items()} for name, rec in msg.content.array_records.items()}


@pytest.mark.slow
def test_error_feedback_keeps_each_records_residual_across_rounds_without_v(tiny_data, tmp_path,
                                                                            caplog) -> None:  # noqa: ANN001
    """Δ and v at int8+ef, v every 2 rounds: no round finds its kept residual unusable (one entry
    holds both records' residuals, and round 2's reply has no v: codec/feedback.py)."""
    cfg = _cfg(tiny_data, tmp_path, v_sync_every=2, num_server_rounds=3, codec="int8+ef",
               client_state_dir=str(tmp_path / "state"))
    with caplog.at_level("WARNING"):
        rows = metric_rows(run_federated(InProcessGrid(2, cfg.to_flower()), cfg))
    assert [set(r["bytes"]["up"]) for r in rows] == [{wire.DELTA, wire.V_LOCAL}, {wire.DELTA},
                                                     {wire.DELTA, wire.V_LOCAL}]
    assert not [r.message for r in caplog.records if "unusable" in r.message or "from zero" in r.message]
