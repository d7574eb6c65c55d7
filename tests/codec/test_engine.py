"""Codecs in whole in-process runs (tiny Fashion-MNIST, mlp, 2 nodes): the row's bytes are the
messages' payloads, a run killed and resumed with error feedback equals one that was not, the
residual is the client's durable state, and dp composes with the codecs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message

from adaptfl.algorithms.config import RunConfig
from adaptfl.client_app import client_state
from adaptfl.client_app import session as client_session
from adaptfl.client_app.app import train_or_refuse
from adaptfl.codec.feedback import RESIDUAL
from adaptfl.core import wire
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.privacy.mechanism import GaussianMean
from adaptfl.server_app.loop import build_run, run_federated
from tests.support.run_outputs import (
    assert_model_within_rounding,
    die_before_checkpoint,
    final_model,
    metric_rows,
)

pytestmark = pytest.mark.slow


def _cfg(tiny_data, tmp_path: Path, **kw) -> RunConfig:  # noqa: ANN001
    values = dict(model="mlp", algorithm="fedact", num_server_rounds=2, local_steps=2, batch_size=16,
                  data_dir=tiny_data["fashion-mnist"], figures=False, results_dir=str(tmp_path), run_name="r",
                  client_state_dir=str(tmp_path / "state"), fraction_train=1.0,
                  accept_small_rounds=True)  # two nodes a round
    return RunConfig.of(**{**values, **kw})


class Recording:
    """The handler, keeping every instruction as the client got it and every reply."""

    def __init__(self) -> None:
        self.pairs: list[tuple[Message, Message]] = []

    def __call__(self, msg: Message, context) -> Message:  # noqa: ANN001
        reply = train_or_refuse(msg, context)
        self.pairs.append((msg, reply))
        return reply


def _by_record(msg: Message) -> dict[str, int]:
    return {name: sum(len(a.data) for a in rec.values()) for name, rec in msg.content.array_records.items()}


def _sum(per_message: list[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for sizes in per_message:
        for name, size in sizes.items():
            out[name] = out.get(name, 0) + size
    return out


@pytest.fixture(scope="module")
def fp32_rows(tiny_data, tmp_path_factory) -> list[dict]:  # noqa: ANN001
    """The rows of the uncompressed run both codec settings below are measured against (one run
    for the module: it does not depend on the codecs compared with it)."""
    cfg = _cfg(tiny_data, tmp_path_factory.mktemp("fp32"), codec="fp32", codec_delta="", run_name="fp32")
    return metric_rows(run_federated(InProcessGrid(2, cfg.to_flower()), cfg))


# one xdist group per shared run, so `-n 2 --dist loadgroup` computes it once, on one worker
@pytest.mark.xdist_group("codec-engine-fp32-run")
@pytest.mark.parametrize("codecs", [dict(codec="int8"), dict(codec="int8", codec_delta="top10%:nf4+ef")])
def test_the_rows_bytes_are_the_payloads_sent_and_received(tiny_data, tmp_path, codecs, fp32_rows) -> None:
    recording = Recording()
    cfg = _cfg(tiny_data, tmp_path, **codecs)
    rows = metric_rows(run_federated(InProcessGrid(2, cfg.to_flower(), handler=recording), cfg))
    plain = fp32_rows
    assert len(recording.pairs) == 4 and not any(reply.has_error() for _, reply in recording.pairs)
    for r, (row, fp32_row) in enumerate(zip(rows, plain, strict=True), start=1):
        pairs = recording.pairs[2 * (r - 1): 2 * r]
        assert row["replies-accepted"] == 2, row["rejected"]
        assert all(int(m.content.config_records[wire.CONFIG]["server-round"]) == r for m, _ in pairs)
        down, up = _sum([_by_record(m) for m, _ in pairs]), _sum([_by_record(rep) for _, rep in pairs])
        assert row["bytes"] == {"down": down, "up": up}
        assert row["bytes-down"] == sum(down.values()) and row["bytes-up"] == sum(up.values())
        assert set(up) == {wire.DELTA, wire.V_LOCAL}
        assert set(down) == ({wire.ARRAYS} if r == 1 else {wire.ARRAYS, wire.DELTA_G, wire.V_BAR})
        # the model is exact: its bytes are fp32's; every other record is smaller than at fp32
        assert down[wire.ARRAYS] == fp32_row["bytes"]["down"][wire.ARRAYS]
        for direction in ("down", "up"):
            for name, size in row["bytes"][direction].items():
                if name != wire.ARRAYS:
                    assert size < fp32_row["bytes"][direction][name] / 3, (name, size)
        ratio = (fp32_row["bytes-down"] + fp32_row["bytes-up"]) / (row["bytes-down"] + row["bytes-up"])
        assert row["compression-ratio"] == pytest.approx(ratio, rel=1e-12) and ratio > 1.0
        assert "compression-ratio" not in fp32_row
        assert ("ef-residual-norm" in row) == ("+ef" in codecs.get("codec_delta", ""))


EF = dict(codec="int8", codec_delta="top10%:int8+ef", num_server_rounds=3)


@pytest.fixture(scope="module")
def uninterrupted(tiny_data, tmp_path_factory) -> dict[str, torch.Tensor]:  # noqa: ANN001
    """The final model of the EF run that is never killed: one run for both resume tests."""
    whole = _cfg(tiny_data, tmp_path_factory.mktemp("whole"), **EF)
    return final_model(run_federated(InProcessGrid(2, whole.to_flower()), whole))


@pytest.fixture
def residual_loads(monkeypatch) -> list[tuple[int, bool, int]]:  # noqa: ANN001
    """(round, found, source) of every client's load of its residual."""
    loads: list[tuple[int, bool, int]] = []
    original = client_state.ClientStateStore.load

    def spy(self, name, expect=None):  # noqa: ANN001, ANN202
        tensors, source = original(self, name, expect)
        if name == RESIDUAL:
            loads.append((self.server_round, tensors is not None, int(source)))
        return tensors, source

    monkeypatch.setattr(client_state.ClientStateStore, "load", spy)
    return loads


@pytest.mark.xdist_group("codec-engine-ef-run")
def test_a_resumed_run_with_residuals_equals_an_uninterrupted_one(tiny_data, tmp_path, monkeypatch,
                                                                  residual_loads, uninterrupted) -> None:
    expected = uninterrupted
    cut = _cfg(tiny_data, tmp_path / "cut", **EF)
    with monkeypatch.context() as m:
        die_before_checkpoint(m, 2)
        with pytest.raises(KeyboardInterrupt):
            run_federated(InProcessGrid(2, cut.to_flower()), cut)
    # the residual is the client's durable state, on disk (one file per round it replied in)
    files = sorted(p.name for p in (tmp_path / "cut" / "state").rglob(f"{RESIDUAL}.r*.pt"))
    assert files == [f"{RESIDUAL}.r1.pt", f"{RESIDUAL}.r1.pt", f"{RESIDUAL}.r2.pt", f"{RESIDUAL}.r2.pt"]
    saved = torch.load(next((tmp_path / "cut" / "state").rglob(f"{RESIDUAL}.r1.pt")),
                       weights_only=True)["tensors"]
    assert {k.split("/")[0] for k in saved} == {wire.DELTA} and all(t.dtype == torch.float64
                                                                      for t in saved.values())
    # a fresh grid: the clients' memory is gone, their state comes from disk
    residual_loads.clear()
    out = run_federated(InProcessGrid(2, cut.to_flower()), cut.replace(resume=True))
    assert [r["round"] for r in metric_rows(out)] == [1, 2, 3]
    disk = int(client_state.StateSource.DISK)
    assert [(r, found) for r, found, _ in residual_loads] == [(2, True), (2, True), (3, True), (3, True)]
    assert [source for r, _, source in residual_loads if r == 2] == [disk, disk]
    assert_model_within_rounding(final_model(out), expected)  # MKL: see the helper


@pytest.mark.xdist_group("codec-engine-ef-run")
def test_without_its_state_dir_a_client_starts_from_zero_and_the_run_goes_on(
        tiny_data, tmp_path, monkeypatch, residual_loads, uninterrupted) -> None:
    expected = uninterrupted
    cut = _cfg(tiny_data, tmp_path / "cut", **EF)
    with monkeypatch.context() as m:
        die_before_checkpoint(m, 2)
        with pytest.raises(KeyboardInterrupt):
            run_federated(InProcessGrid(2, cut.to_flower()), cut)
    shutil.rmtree(tmp_path / "cut" / "state")
    residual_loads.clear()
    out = run_federated(InProcessGrid(2, cut.to_flower()), cut.replace(resume=True))
    rows = metric_rows(out)
    assert [r["replies-accepted"] for r in rows] == [2, 2, 2]
    # round 2 finds nothing (from zero), round 3 finds what round 2 saved
    assert [(r, found) for r, found, _ in residual_loads] == [(2, False), (2, False), (3, True), (3, True)]
    # round 2 sent C(Δ) with no residual added: another model than the uninterrupted run's
    assert any(not torch.equal(a, b) for a, b in zip(final_model(out).values(), expected.values(),
                                                     strict=True))
    assert (tmp_path / "cut" / "state").is_dir()  # written again from round 2 on


def test_dp_central_clips_and_noises_the_decoded_replies(tiny_data, tmp_path, monkeypatch) -> None:
    seen: list[dict[str, torch.Tensor]] = []
    original = GaussianMean.combine

    def spy(self, items, weights, record, ctx):  # noqa: ANN001, ANN202
        if record == wire.DELTA:
            seen.extend({n: t.clone() for n, t in dict(item).items()} for item in items)
        return original(self, items, weights, record, ctx)

    monkeypatch.setattr(GaussianMean, "combine", spy)
    recording = Recording()
    cfg = _cfg(tiny_data, tmp_path, algorithm="fedavg", weighting="uniform", dp="central", dp_seed=1,
               dp_testing_reproducible_noise=True, dp_accounting="no-amplification", codec="int8",
               num_server_rounds=1, dp_accept_epsilon=1e3)  # two nodes: far past the default bound
    out = run_federated(InProcessGrid(2, cfg.to_flower(), handler=recording), cfg)
    rows = metric_rows(out)
    assert "dp-epsilon" in rows[0] and "replies-accepted" not in rows[0]  # who fared how: confidential
    # under dp the public row is the release whitelist: the bytes and the ratio are the server's
    assert "compression-ratio" not in rows[0] and "bytes-up" not in rows[0]
    confidential = json.loads((out / "server-confidential.jsonl").read_text().splitlines()[-1])
    assert confidential["compression-ratio"] > 1.0
    c = cfg.compression
    decoded = []
    for _, reply in recording.pairs:
        arrays = reply.content[wire.DELTA].to_torch_state_dict()
        assert any(k.endswith("@q") for k in arrays)  # int8 on the wire
        spec = {n: (tuple(seen[0][n].shape), torch.float32) for n in seen[0]}
        decoded.append(c.of(wire.DELTA).decode(arrays, spec, c.codec_block))
    assert len(seen) == 2  # what the mechanism clipped: the decoded values, in node order
    for got, want in zip(seen, decoded, strict=True):
        assert all(torch.equal(got[n], want[n]) for n in want)


def test_dp_client_replies_decode_to_the_round_trip_of_the_privatized_values(
        tiny_data, tmp_path, monkeypatch) -> None:
    """The codec runs after dp's noise (post-processing): with the same noise, the int8 reply
    decodes to exactly the round trip of the fp32 reply (the privatized Δ). A dp='client' node
    refuses a server's dp-seed, so the client's own noise seed is fixed here instead."""
    monkeypatch.setattr(client_session, "round_seed", lambda dp_seed, *parts: sum(map(hash, parts[1:])) + 1)
    replies = {}
    for codec in ("fp32", "int8"):
        cfg = _cfg(tiny_data, tmp_path / codec, algorithm="fedavg", weighting="uniform", dp="client",
                   dp_accounting="no-amplification", codec=codec)
        strategy, _, _ = build_run(cfg)
        strategy.state.run_key = "0" * 32  # the same noise for both: so each its own node ledgers,
        monkeypatch.setenv("ADAPTFL_LEDGER_DIR", str(tmp_path / f"ledgers-{codec}"))  # a replay else
        grid = InProcessGrid(2, cfg.to_flower())
        sent = strategy.configure_train(1, ArrayRecord(strategy.state.model), ConfigRecord(), grid)
        replies[codec] = list(grid.send_and_receive(sent))
        assert not any(r.has_error() for r in replies[codec])
        strategy.aggregate_train(1, replies[codec])
        assert strategy.report.accepted == 2, strategy.report.rejected
    c = cfg.compression
    for plain, coded in zip(replies["fp32"], replies["int8"], strict=True):
        privatized = plain.content[wire.DELTA].to_torch_state_dict()
        arrays = coded.content[wire.DELTA].to_torch_state_dict()
        assert not set(privatized) & set(arrays)  # every array encoded
        spec = {n: (tuple(t.shape), t.dtype) for n, t in privatized.items()}
        decoded = c.of(wire.DELTA).decode(arrays, spec, c.codec_block)
        expected = c.of(wire.DELTA).round_trip(privatized, c.codec_block)
        assert all(torch.equal(decoded[n], expected[n]) for n in spec)
        assert any(not torch.equal(decoded[n], privatized[n]) for n in spec)  # lossy indeed
