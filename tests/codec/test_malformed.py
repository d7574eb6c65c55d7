"""Every malformed encoding is dropped, with its reason, before it touches the server state
(validation.py: the encoded metadata first, then each record decoded). FedACT under
codec='int8' (v) and codec-delta='top50%:nf4' (Δ), driven by hand as tests/strategies do."""

from __future__ import annotations

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from adaptfl.algorithms.config import RunConfig
from adaptfl.core import wire
from adaptfl.core.contract import ModelSpec
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.strategies import AdaptiveStrategy

F32 = torch.float32
SPEC = ModelSpec({"w": ((8,), F32), "b": ((2,), F32)}, ("w", "b"))
MODEL = {"w": torch.linspace(-1.0, 1.0, 8), "b": torch.tensor([3.0, -3.0])}
DELTA = {"w": torch.tensor([1.0, -2.0, 0.5, 3.0, 0.25, -4.0, 0.1, 2.0]), "b": torch.tensor([1.0, -0.5])}
V = {"w": torch.tensor([1.0, 2.0, 3.0, 4.0, 0.5, 0.25, 8.0, 1.5]), "b": torch.tensor([1.0, 2.0])}


def _strategy() -> AdaptiveStrategy:
    strategy = AdaptiveStrategy(RunConfig.of(
        algorithm="fedact", local_steps=2, lr=0.5, lr_schedule="constant", num_server_rounds=4,
        fraction_train=1.0, min_replies=1, codec="int8", codec_delta="top50%:nf4", codec_block=4,
        codec_positions="int32"))
    strategy.initialize(MODEL, SPEC)
    return strategy


def _encoded(strategy: AdaptiveStrategy, scale: float = 1.0) -> dict[str, dict[str, torch.Tensor]]:
    c = strategy.cfg.compression
    return {wire.DELTA: c.of(wire.DELTA).encode({k: t * scale for k, t in DELTA.items()}, c.codec_block),
            wire.V_LOCAL: c.of(wire.V_LOCAL).encode(V, c.codec_block)}


def _message(to: Message, records: dict[str, dict[str, torch.Tensor]]) -> Message:
    content = RecordDict({name: ArrayRecord(dict(arrays)) for name, arrays in records.items()})
    content[wire.METRICS] = MetricRecord({wire.NUM_EXAMPLES: 4, wire.TRAIN_LOSS: 1.0})
    return Message(content=content, reply_to=to)


def _set(record: str, name: str, value: torch.Tensor | None):  # noqa: ANN202
    def change(r: dict[str, dict[str, torch.Tensor]]) -> None:
        if value is None:
            del r[record][name]
        else:
            r[record][name] = value
    return change


def _fp32_instead(r: dict[str, dict[str, torch.Tensor]]) -> None:
    for part in ("w@i", "w@vq", "w@vs"):
        del r[wire.DELTA][part]
    r[wire.DELTA]["w"] = DELTA["w"].clone()


def _nan_scale(r: dict[str, dict[str, torch.Tensor]]) -> None:
    r[wire.V_LOCAL]["w@s"] = torch.tensor([float("nan"), 1.0])


# (what is wrong, how, a word of the reason)
BAD = [
    ("scale shape", _set(wire.V_LOCAL, "w@s", torch.ones(3)), "w@s"),
    ("scale dtype", _set(wire.V_LOCAL, "w@s", torch.ones(2, dtype=torch.float64)), "w@s"),
    ("NaN scale", _nan_scale, "scales"),
    ("inf scale", _set(wire.V_LOCAL, "b@s", torch.tensor([float("inf")])), "scales"),
    ("zero scale", _set(wire.V_LOCAL, "w@s", torch.tensor([0.0, 1.0])), "scales"),
    ("negative scale", _set(wire.V_LOCAL, "w@s", torch.tensor([1.0, -2.0])), "scales"),
    ("nf4 scale zero", _set(wire.DELTA, "w@vs", torch.tensor([0.0])), "scales"),
    ("int8 -128", _set(wire.V_LOCAL, "w@q", torch.tensor([127, 1, 2, 3, 4, 5, -128, 7], dtype=torch.int8)),
     "-128"),
    ("int8 as uint8", _set(wire.V_LOCAL, "w@q", torch.ones(8, dtype=torch.uint8)), "w@q"),
    ("position past the end", _set(wire.DELTA, "w@i", torch.tensor([1, 3, 5, 8], dtype=torch.int32)),
     "position outside"),
    ("negative position", _set(wire.DELTA, "w@i", torch.tensor([-1, 3, 5, 7], dtype=torch.int32)),
     "position outside"),
    ("repeated positions", _set(wire.DELTA, "w@i", torch.tensor([1, 3, 3, 5], dtype=torch.int32)),
     "strictly increasing"),
    ("unsorted positions", _set(wire.DELTA, "w@i", torch.tensor([3, 1, 5, 7], dtype=torch.int32)),
     "strictly increasing"),
    ("positions as int64", _set(wire.DELTA, "w@i", torch.tensor([1, 3, 5, 7])), "w@i"),
    ("top-k count not the declared one", _set(wire.DELTA, "w@i", torch.tensor([1, 3, 5], dtype=torch.int32)),
     "w@i"),
    ("a missing part", _set(wire.DELTA, "w@vs", None), "w@vs"),
    ("an extra part", _set(wire.DELTA, "w@x", torch.zeros(1)), "w@x"),
    ("fp32 where an encoding is due", _fp32_instead, "delta"),
]


def _state(strategy: AdaptiveStrategy) -> tuple:
    s = strategy.state
    return s.server_round, {n: t.clone() for n, t in s.model.items()}, \
        {r: {n: t.clone() for n, t in a.items()} for r, a in s.extras.items()}


def _same(a: tuple, b: tuple) -> bool:
    return a[0] == b[0] and a[1].keys() == b[1].keys() and a[2].keys() == b[2].keys() \
        and all(torch.equal(a[1][n], b[1][n]) for n in a[1]) \
        and all(a[2][r].keys() == b[2][r].keys() and all(torch.equal(a[2][r][n], b[2][r][n]) for n in a[2][r])
                for r in a[2])


@pytest.fixture
def after_round_1() -> tuple[AdaptiveStrategy, InProcessGrid]:
    """Round 1 aggregated from one good reply, so Δ_G and v̄ are in the state (as int8)."""
    grid = InProcessGrid(len(BAD) + 1, {})
    strategy = _strategy()
    sent = strategy.configure_train(1, ArrayRecord(strategy.state.model), ConfigRecord(), grid)
    strategy.aggregate_train(1, [_message(sent[0], _encoded(strategy))])
    assert strategy.report.accepted == 1 and {wire.DELTA_G, wire.V_BAR} <= set(strategy.state.extras)
    return strategy, grid


def _bad_replies(strategy: AdaptiveStrategy, sent: list[Message]) -> list[Message]:
    replies = []
    for (_, change, _), to in zip(BAD, sent, strict=False):
        records = _encoded(strategy)
        change(records)
        replies.append(_message(to, records))
    return replies


def _reason_of(strategy: AdaptiveStrategy, sent: list[Message], i: int) -> str:
    return strategy.report.rejected[str(sent[i].metadata.dst_node_id)]


def test_every_malformed_encoding_is_dropped_and_the_state_is_unchanged(after_round_1) -> None:
    strategy, grid = after_round_1
    sent = strategy.configure_train(2, ArrayRecord(strategy.state.model), ConfigRecord(), grid)
    before = _state(strategy)
    model, metrics = strategy.aggregate_train(2, _bad_replies(strategy, sent))
    assert model is None and strategy.report.accepted == 0 and strategy.report.skipped
    assert len(strategy.report.rejected) == len(BAD)
    for i, (what, _, word) in enumerate(BAD):
        assert word in _reason_of(strategy, sent, i), (what, _reason_of(strategy, sent, i))
    assert _same(_state(strategy), before)
    assert strategy.report.bytes_up == 0 and not strategy.report.up_bytes  # nothing accepted


def test_a_good_reply_next_to_them_is_accepted(after_round_1) -> None:
    strategy, grid = after_round_1
    sent = strategy.configure_train(2, ArrayRecord(strategy.state.model), ConfigRecord(), grid)
    before = _state(strategy)
    good = _message(sent[-1], _encoded(strategy, scale=0.5))
    model, _ = strategy.aggregate_train(2, [*_bad_replies(strategy, sent), good])
    assert model is not None and strategy.report.accepted == 1
    assert len(strategy.report.rejected) == len(BAD)
    assert str(sent[-1].metadata.dst_node_id) not in strategy.report.rejected
    assert not _same(_state(strategy), before) and strategy.state.server_round == 2
    # the one reply's Δ is what its encoding decodes to: x moved by it exactly (FedAvg-style mean of one)
    c = strategy.cfg.compression
    decoded = c.of(wire.DELTA).decode(good.content[wire.DELTA].to_torch_state_dict(),
                                      {n: ((t.numel(),), F32) for n, t in DELTA.items()}, c.codec_block)
    assert strategy.report.bytes_up == sum(len(a.data) for rec in good.content.array_records.values()
                                           for a in rec.values())
    assert int((decoded["w"] != 0).sum()) == 4  # top50% of 8
    for n, t in strategy.state.model.items():  # x + the decoded Δ (the mean of one reply)
        assert torch.allclose(t, before[1][n] + decoded[n], rtol=0, atol=1e-6), n
        assert not torch.allclose(t, before[1][n] + 0.5 * DELTA[n], rtol=0, atol=1e-4)  # not the raw Δ


def test_the_good_encoding_itself_decodes_to_the_kept_values() -> None:
    strategy = _strategy()
    encoded = _encoded(strategy)
    assert encoded[wire.DELTA]["w@i"].tolist() == [1, 3, 5, 7]  # |-2|, |3|, |-4|, |2|
    assert encoded[wire.V_LOCAL]["w@s"].tolist() == [4.0, 8.0]  # block 4: absmax of each half


@pytest.mark.parametrize("codec,part,value", [
    ("top50%", "w@v", torch.tensor([1.0, float("nan"), 2.0, 3.0])),
    ("top50%", "w@v", torch.tensor([1.0, float("inf"), 2.0, 3.0])),
    ("fp16", "w@fp16", torch.tensor([1.0, 2.0, float("inf"), 0.0, 1.0, 1.0, 1.0, 1.0], dtype=torch.float16)),
    ("bf16", "w@bf16", torch.full((8,), 0x7FC0, dtype=torch.int16)),  # bf16 NaN bits
])
def test_non_finite_decoded_values_are_refused_as_ever(codec, part, value) -> None:
    """A well-formed encoding of a non-finite value decodes, and today's value checks drop it."""
    grid = InProcessGrid(2, {})
    strategy = AdaptiveStrategy(RunConfig.of(algorithm="fedact", local_steps=2, lr=0.5,
                                             lr_schedule="constant", fraction_train=1.0, min_replies=1,
                                             codec_delta=codec))
    strategy.initialize(MODEL, SPEC)
    sent = strategy.configure_train(1, ArrayRecord(strategy.state.model), ConfigRecord(), grid)
    before = _state(strategy)
    c = strategy.cfg.compression
    records = {wire.DELTA: c.of(wire.DELTA).encode(DELTA, c.codec_block), wire.V_LOCAL: dict(V)}
    records[wire.DELTA][part] = value
    good = {wire.DELTA: c.of(wire.DELTA).encode(DELTA, c.codec_block), wire.V_LOCAL: dict(V)}
    strategy.aggregate_train(1, [_message(sent[0], records), _message(sent[1], good)])
    assert strategy.report.accepted == 1
    reason = strategy.report.rejected[str(sent[0].metadata.dst_node_id)]
    assert reason.startswith("delta[w]") and "finite" in reason, reason
    assert not _same(_state(strategy), before)  # the good one was taken
