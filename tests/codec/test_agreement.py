"""fp32 sends today's bytes exactly; under a lossy codec the server keeps what its clients
decode of every broadcast record, bit for bit, and still does after a checkpoint round trip.
Real clients (client_app) on the tiny Fashion-MNIST, rounds driven by hand."""

from __future__ import annotations

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message

from adaptfl.algorithms.config import RunConfig
from adaptfl.algorithms.recipe import compression_from_recipe
from adaptfl.client_app.app import train_or_refuse
from adaptfl.core import wire
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.server_app.loop import build_run
from adaptfl.strategies.state import ServerState
from tests.support.decoded import Decoded, record_decoded


def _cfg(tiny_data, tmp_path, **kw) -> RunConfig:  # noqa: ANN001
    values = dict(accept_small_rounds=True,  # rounds of one or two nodes
                  model="mlp", algorithm="fedact", num_server_rounds=4, local_steps=2, batch_size=16,
                  data_dir=tiny_data["fashion-mnist"], figures=False, results_dir=str(tmp_path), run_name="r",
                  fraction_train=1.0)
    return RunConfig.of(**{**values, **kw})


class Recording:
    def __init__(self) -> None:
        self.replies: list[Message] = []

    def __call__(self, msg: Message, context) -> Message:  # noqa: ANN001
        reply = train_or_refuse(msg, context)
        self.replies.append(reply)
        return reply


def _round(strategy, grid: InProcessGrid, server_round: int) -> list[Message]:  # noqa: ANN001
    sent = strategy.configure_train(server_round, ArrayRecord(strategy.state.model), ConfigRecord(), grid)
    replies = list(grid.send_and_receive(sent))
    assert not any(r.has_error() for r in replies), [r.error.reason for r in replies if r.has_error()]
    strategy.aggregate_train(server_round, replies)
    assert strategy.report.accepted == len(sent), strategy.report.rejected
    return sent


def _arrays(content) -> dict[str, dict[str, tuple]]:  # noqa: ANN001
    return {name: {k: (a.dtype, tuple(a.shape), a.data) for k, a in rec.items()}
            for name, rec in content.array_records.items()}


@pytest.mark.parametrize("explicit", [{"codec": "fp32"}, {"codec": "fp32", "codec_delta": "fp32",
                                                          "codec_v_bar": "fp32",
                                                          "codec_rounding": "stochastic"}])
def test_fp32_sends_and_replies_todays_bytes(tiny_data, tmp_path, explicit) -> None:
    outcome = []
    for kw in ({}, explicit):
        recording = Recording()
        strategy, _, _ = build_run(_cfg(tiny_data, tmp_path, **kw))
        strategy.state.run_key = "0" * 32  # drawn per run: the same for both
        grid = InProcessGrid(2, strategy.cfg.to_flower(), handler=recording)
        first = _round(strategy, grid, 1)
        second = _round(strategy, grid, 2)  # Δ_G and v̄ sent now
        recipe = dict(second[0].content.config_records[wire.RECIPE])
        assert not [k for k in recipe if k.startswith("compression.")]
        assert compression_from_recipe(recipe).lossless
        assert {wire.DELTA_G, wire.V_BAR} <= set(second[0].content.array_records)
        assert not any("@" in k for rec in second[0].content.array_records.values() for k in rec)
        outcome.append(([_arrays(m.content) for m in first + second], recipe,
                        [_arrays(r.content) for r in recording.replies],
                        [{k: v for k, v in r.content.metric_records[wire.METRICS].items()
                          if k != wire.PEAK_MEMORY} for r in recording.replies],  # the process's, not ours
                        strategy.report.metrics))
    (down_a, recipe_a, up_a, metrics_a, report_a), (down_b, recipe_b, up_b, metrics_b, report_b) = outcome
    assert down_a == down_b  # every Array's dtype, shape and bytes
    assert recipe_a == recipe_b
    assert up_a == up_b and metrics_a == metrics_b
    assert wire.EF_RESIDUAL not in metrics_b[0]
    assert "compression-ratio" not in report_b and report_a["bytes-down"] == report_b["bytes-down"]


@pytest.fixture
def decoded_by_clients(monkeypatch) -> list[Decoded]:  # noqa: ANN001
    """Each client session's broadcast records as it decoded them (in the order of the sessions)."""
    def by_session(seen: list[Decoded], name: str, record: dict[str, torch.Tensor]) -> None:
        if not seen or name in seen[-1]:
            seen.append({})
        seen[-1][name] = record
    return record_decoded(monkeypatch, by_session)


def _snapshot(extras: dict, names: tuple[str, ...]) -> dict:
    return {n: {k: t.clone() for k, t in extras[n].items()} for n in names}


def _assert_bitwise(client: dict, server: dict) -> None:
    for name, tensors in server.items():
        assert client[name].keys() == tensors.keys(), name
        for k, t in tensors.items():
            assert torch.equal(client[name][k].cpu().view(torch.int32), t.view(torch.int32)), (name, k)


@pytest.mark.parametrize("algorithm,codec,records", [
    ("fedact", dict(codec="nf4"), (wire.DELTA_G, wire.V_BAR)),
    ("fedact", dict(codec="top10%:int8", codec_v_bar="fp4"), (wire.DELTA_G, wire.V_BAR)),
    ("fedact", dict(codec="top90%:fp4"), (wire.DELTA_G, wire.V_BAR)),
    ("fedact", dict(codec="top50%:nf4", codec_block=16), (wire.DELTA_G, wire.V_BAR)),
    ("fedact", dict(codec="bf16", codec_rounding="stochastic"), (wire.DELTA_G, wire.V_BAR)),
    ("scaffold", dict(codec="int8"), (wire.SCAFFOLD_C,)),
])
@pytest.mark.slow
def test_clients_decode_exactly_the_servers_state_also_after_a_checkpoint(
        tiny_data, tmp_path, decoded_by_clients, algorithm, codec, records) -> None:
    cfg = _cfg(tiny_data, tmp_path, algorithm=algorithm, **codec)
    strategy, _, _ = build_run(cfg)
    grid = InProcessGrid(2, cfg.to_flower())
    _round(strategy, grid, 1)
    kept = _snapshot(strategy.state.extras, records)
    decoded_by_clients.clear()
    sent = _round(strategy, grid, 2)
    assert all("@" in k for name in records for k in sent[0].content[name])  # encoded indeed
    assert len(decoded_by_clients) == 2
    for client in decoded_by_clients:
        _assert_bitwise(client, kept)
    # lossy: the kept state is not the float32 aggregate (some value differs from a plain mean)
    # but a fixed point of the codec: what the instruction decodes to
    codec_of = strategy.cfg.compression
    for name in records:
        c = codec_of.of(name)
        assert not c.lossless
        assert all(torch.equal(c.round_trip(kept[name], codec_of.codec_block)[k], kept[name][k])
                   for k in kept[name])
    # the checkpoint: a fresh server from the saved state sends what decodes to the same values
    after_2 = _snapshot(strategy.state.extras, records)
    resumed, _, _ = build_run(cfg)
    resumed.state = ServerState.from_bytes(strategy.state.to_bytes())
    decoded_by_clients.clear()
    sent_again = resumed.configure_train(3, ArrayRecord(resumed.state.model), ConfigRecord(), grid)
    first_sent = strategy.configure_train(3, ArrayRecord(strategy.state.model), ConfigRecord(), grid)
    for name in records:  # the same bytes as the uninterrupted server would send
        assert {k: a.data for k, a in sent_again[0].content[name].items()} == \
            {k: a.data for k, a in first_sent[0].content[name].items()}
    list(grid.send_and_receive(sent_again))
    for client in decoded_by_clients:
        _assert_bitwise(client, after_2)
