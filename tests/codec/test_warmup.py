"""codec-warmup=R (codec/settings.py): rounds 1..R send every shared record at
codec-warmup-codec, then the run's codecs. By hand: each round's codecs; on the in-process engine:
the warm-up rows' bytes are fp32's (or the warm-up codec's) to the byte, the later rows' are
those of the same run without a warm-up, the row says which ran, and clients decode exactly the
server's state in the first compressed round, also after rounds skipped across the warm-up's end."""

from __future__ import annotations

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord

from adaptfl.algorithms.config import RunConfig
from adaptfl.core import wire
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.server_app.loop import build_run, run_federated
from tests.support.decoded import Decoded, record_decoded
from tests.support.run_outputs import metric_rows

RECORDS = wire.SHARED_DOWN + wire.SHARED_UP


def _cfg(tiny_data, tmp_path, **kw) -> RunConfig:  # noqa: ANN001
    values = dict(accept_small_rounds=True,  # rounds of one or two nodes
                  model="mlp", algorithm="fedact", num_server_rounds=3, local_steps=2, batch_size=16,
                  data_dir=tiny_data["fashion-mnist"], figures=False, results_dir=str(tmp_path), run_name="r",
                  fraction_train=1.0)
    return RunConfig.of(**{**values, **kw})


def test_each_rounds_codecs() -> None:
    c = RunConfig.of(algorithm="fedact", codec="int8", codec_delta="top10%:nf4+ef",
                     codec_warmup=2).compression
    assert [c.for_round(r).lossless for r in (1, 2, 3, 10)] == [True, True, False, False]
    assert str(c.for_round(3).of(wire.DELTA)) == "top10%:nf4+ef"
    assert str(c.for_round(3).of(wire.V_BAR)) == "int8"
    light = RunConfig.of(algorithm="fedact", codec="lean", codec_warmup=1,
                         codec_warmup_codec="int8+ef").compression
    # lean for fedact: Δ int2+ef, Δ_G int2, v nf4 (round 1 only); the warm-up: int8 on every
    # record, the broadcast's without error feedback
    assert {str(light.for_round(1).of(r)) for r in (wire.DELTA, wire.V_LOCAL)} == {"int8+ef"}
    assert str(light.for_round(1).of(wire.DELTA_G)) == "int8"
    after = light.for_round(2)
    assert (str(after.of(wire.DELTA)), str(after.of(wire.DELTA_G))) == ("int2+ef", "int2")
    plain = RunConfig.of(algorithm="fedact", codec="nf4").compression
    assert all(plain.for_round(r) is plain for r in (1, 2))  # no warm-up: the run's codecs from round 1


@pytest.mark.parametrize("keys,message", [
    ({"codec": "nf4", "codec_warmup": -1}, "invalid codec-warmup=-1: must be >= 0"),
    ({"codec_warmup": 2}, "codec-warmup=2 with codec-warmup-codec='fp32': every record runs that codec"),
    ({"codec": "int8", "codec_warmup": 1, "codec_warmup_codec": "int8"}, "every record runs that codec"),
    ({"codec_warmup_codec": "int8"}, "codec-warmup-codec='int8' with codec-warmup=0: no round reads it"),
    ({"codec": "nf4", "codec_warmup": 1, "codec_warmup_codec": "top9"}, "invalid codec-warmup-codec='top9'"),
    ({"codec": "nf4", "codec_warmup": 1, "codec_warmup_codec": "rand5%"},
     "codec-warmup-codec='rand5%': invalid codec='rand5%': random-k (rand) is for replies"),
    ({"codec_delta_g": "nf4", "codec_warmup": 1, "codec_warmup_codec": "int8", "secagg": "secagg+"},
     "secagg='secagg+' with the lossy codec 'int8' on 'delta'"),
])
def test_bad_warmups_are_refused_in_one_line(keys, message) -> None:  # noqa: ANN001
    with pytest.raises(ValueError) as err:
        RunConfig.of(algorithm="fedact", **keys)
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)


def _rows(cfg: RunConfig) -> list[dict]:
    return metric_rows(run_federated(InProcessGrid(2, cfg.to_flower()), cfg))


@pytest.mark.slow
def test_the_warmup_rows_are_dense_then_the_runs_codecs(tiny_data, tmp_path) -> None:
    codecs = dict(codec="int8", codec_delta="top10%:nf4+ef")
    warm = _rows(_cfg(tiny_data, tmp_path / "w", codec_warmup=1, **codecs))
    light = _rows(_cfg(tiny_data, tmp_path / "l", codec_warmup=2, codec_warmup_codec="bf16", **codecs))
    fp32 = _rows(_cfg(tiny_data, tmp_path / "f"))
    cold = _rows(_cfg(tiny_data, tmp_path / "c", **codecs))
    assert [r["codec-warmup"] for r in warm] == [1.0, 0.0, 0.0]
    assert [r["codec-warmup"] for r in light] == [1.0, 1.0, 0.0]
    assert not any("codec-warmup" in r for r in cold + fp32)
    assert warm[0]["bytes"] == fp32[0]["bytes"]  # round 1 at fp32, to the byte
    for r in (1, 2):  # then the run's codecs: the bytes of the same run without a warm-up
        assert warm[r]["bytes"] == cold[r]["bytes"]
    assert light[2]["bytes"] == cold[2]["bytes"]
    # bf16 in rounds 1-2: every record but the model at 2 bytes a value (plus headers)
    up16, up32 = light[1]["bytes"]["up"], fp32[1]["bytes"]["up"]
    assert all(up32[n] / 2 < up16[n] < up32[n] / 2 + 4096 for n in up32)
    assert sum(r["bytes-up"] for r in warm) > sum(r["bytes-up"] for r in cold)


@pytest.fixture
def decoded_by_clients(monkeypatch) -> list[Decoded]:  # noqa: ANN001
    """Every broadcast record a client session decoded, one entry each."""
    return record_decoded(monkeypatch, lambda seen, name, record: seen.append({name: record}))


@pytest.mark.slow
def test_clients_decode_the_servers_state_after_rounds_skipped_across_the_warmups_end(
        tiny_data, tmp_path, decoded_by_clients) -> None:  # noqa: ANN001
    """warm-up 2; round 1 runs (its Δ_G, v̄ kept for round 2's fp32), round 2 gets no reply and is
    skipped, round 3 sends them at nf4: the server keeps what its clients decode, bit for bit."""
    cfg = _cfg(tiny_data, tmp_path, codec="nf4", codec_warmup=2)
    strategy, _, _ = build_run(cfg)
    grid = InProcessGrid(2, cfg.to_flower())
    sent = strategy.configure_train(1, ArrayRecord(strategy.state.model), ConfigRecord(), grid)
    strategy.aggregate_train(1, list(grid.send_and_receive(sent)))
    strategy.configure_train(2, ArrayRecord(strategy.state.model), ConfigRecord(), grid)
    strategy.aggregate_train(2, [])
    assert strategy.report.skipped and strategy.state.server_round == 1
    decoded_by_clients.clear()
    sent = strategy.configure_train(3, ArrayRecord(strategy.state.model), ConfigRecord(), grid)
    assert all("@" in k for k in sent[0].content[wire.V_BAR])  # encoded: nf4 now
    list(grid.send_and_receive(sent))
    assert len(decoded_by_clients) == 4  # Δ_G and v̄, two clients
    for seen in decoded_by_clients:
        for name, tensors in seen.items():
            kept = strategy.state.extras[name]
            assert all(torch.equal(tensors[k].cpu(), kept[k]) for k in kept), name
