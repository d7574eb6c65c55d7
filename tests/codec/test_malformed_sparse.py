"""test_malformed.py's pattern for the cheap-position codecs: a malformed bitmap, Elias-Fano,
int2, random-k or record top-k encoding is dropped with its reason, and the server state stays
what it was (FedACT driven by hand, round 1 from a good reply, round 2 from the bad one)."""

from __future__ import annotations

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord

from adaptfl.algorithms.config import RunConfig
from adaptfl.core import wire
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.strategies import AdaptiveStrategy
from tests.codec.test_malformed import DELTA, MODEL, SPEC, V, _message, _same, _state

U8 = torch.uint8


def _set(record: str, name: str, value: torch.Tensor | None):  # noqa: ANN202
    def change(r: dict[str, dict[str, torch.Tensor]]) -> None:
        if value is None:
            del r[record][name]
        else:
            r[record][name] = value
    return change


# (codec keys, what is wrong, how, a word of the reason); w: 8 values, b: 2, block 4
CASES = [
    # top50% of w: k = 4, a 1-byte bitmap (smaller than 16 bytes of int32 and 2 of Elias-Fano)
    (dict(codec_delta="top50%:int2"), "bitmap with 3 set",
     _set(wire.DELTA, "w@ib", torch.tensor([7], dtype=U8)), "3 positions set"),
    (dict(codec_delta="top50%:int2"), "bitmap padding set",
     _set(wire.DELTA, "b@ib", torch.tensor([1 | 4], dtype=U8)), "padding"),
    (dict(codec_delta="top50%:int2"), "bitmap as int32",
     _set(wire.DELTA, "w@ib", torch.tensor([1], dtype=torch.int32)), "w@ib"),
    # Elias-Fano of k = 4 in 8: b = 1, 4 low bits, a high bitmap of 4 + 3 = 7 bits
    (dict(codec_delta="top50%", codec_positions="elias-fano"), "high bitmap with 3 ones",
     _set(wire.DELTA, "w@ih", torch.tensor([7], dtype=U8)), "ones"),
    (dict(codec_delta="top50%", codec_positions="elias-fano"), "low bits' padding set",
     _set(wire.DELTA, "w@il", torch.tensor([0xF0], dtype=U8)), "padding"),
    (dict(codec_delta="top50%", codec_positions="elias-fano"), "high bitmap's padding set",
     _set(wire.DELTA, "w@ih", torch.tensor([0x80 | 0x0F], dtype=U8)), "padding"),
    (dict(codec_v="int2"), "int2 scale zero", _set(wire.V_LOCAL, "w@s", torch.tensor([0.0, 1.0])), "scales"),
    (dict(codec_v="int2"), "int2 codes of nf4's length", _set(wire.V_LOCAL, "w@q", torch.zeros(4, dtype=U8)),
     "w@q"),
    (dict(codec_delta="rand50%:int2"), "random-k without its seed", _set(wire.DELTA, "@seed", None), "@seed"),
    (dict(codec_delta="rand50%:int2"), "random-k seed as int32",
     _set(wire.DELTA, "@seed", torch.tensor([1], dtype=torch.int32)), "@seed"),
    (dict(codec_delta="rand50%:int2"), "random-k with positions",
     _set(wire.DELTA, "w@i", torch.tensor([0, 1, 2, 3], dtype=torch.int32)), "w@i"),
    (dict(codec_delta="rtop50%", codec_positions="int32"), "record positions unsorted",
     _set(wire.DELTA, "@i", torch.tensor([0, 5, 3, 7, 9], dtype=torch.int32)), "strictly increasing"),
    (dict(codec_delta="rtop50%", codec_positions="int32"), "record positions past the end",
     _set(wire.DELTA, "@i", torch.tensor([0, 3, 5, 7, 10], dtype=torch.int32)), "outside"),
]


@pytest.mark.parametrize("keys,what,change,word", CASES, ids=[c[1] for c in CASES])
def test_a_malformed_cheap_encoding_is_dropped_and_the_state_is_unchanged(keys, what, change, word) -> None:
    strategy = AdaptiveStrategy(RunConfig.of(
        algorithm="fedact", local_steps=2, lr=0.5, lr_schedule="constant", num_server_rounds=4,
        fraction_train=1.0, min_replies=1, codec="int8", codec_block=4, **keys))
    strategy.initialize(MODEL, SPEC)
    c = strategy.cfg.compression

    def encoded() -> dict[str, dict[str, torch.Tensor]]:
        return {wire.DELTA: c.of(wire.DELTA).encode(DELTA, c.codec_block),
                wire.V_LOCAL: c.of(wire.V_LOCAL).encode(V, c.codec_block)}

    grid = InProcessGrid(2, {})
    sent = strategy.configure_train(1, ArrayRecord(strategy.state.model), ConfigRecord(), grid)
    strategy.aggregate_train(1, [_message(sent[0], encoded())])
    assert strategy.report.accepted == 1, strategy.report.rejected
    sent = strategy.configure_train(2, ArrayRecord(strategy.state.model), ConfigRecord(), grid)
    before = _state(strategy)
    bad = encoded()
    change(bad)
    model, _ = strategy.aggregate_train(2, [_message(sent[0], bad)])
    assert model is None and strategy.report.accepted == 0
    reason = strategy.report.rejected[str(sent[0].metadata.dst_node_id)]
    assert word in reason, (what, reason)
    assert _same(_state(strategy), before)
