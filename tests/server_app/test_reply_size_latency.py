"""Issue 21 §4, the denial-of-service half: a reply's size is checked from its arrays' metadata
against the contract before any tensor is decoded, the default bound comes from the contract
(not 1 GiB), and each reply's latency goes into the round's row."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord

from adaptfl.core import wire
from adaptfl.strategies.validation import NPY_HEADER, expected_bytes, reply_bound
from tests.strategies.test_hostile_replies import GRID, HOSTILE, SPEC, _honest, _message, _strategy


def _sent(strategy):  # noqa: ANN001, ANN202
    return {m.metadata.dst_node_id: m for m in strategy.configure_train(
        1, ArrayRecord(strategy.state.model), ConfigRecord(), GRID)}


def test_a_wrong_size_is_dropped_before_any_tensor_is_decoded(monkeypatch) -> None:
    strategy = _strategy("fedavg", max_reply_mb=2.0)  # the per-array check, not the total bound
    sent = _sent(strategy)
    decoded: list[int] = []
    original = ArrayRecord.to_torch_state_dict
    monkeypatch.setattr(ArrayRecord, "to_torch_state_dict",
                        lambda self, *a, **k: decoded.append(len(self)) or original(self, *a, **k))
    big = _message(sent[HOSTILE], _honest(strategy, HOSTILE))
    # the shape a 600 MiB reply would declare (a few bytes of data here)
    big.content.array_records[wire.DELTA]["w"] = Array(dtype="float32", shape=(600, 2**18),
                                                      stype="numpy.ndarray", data=b"\x00" * 64)
    padded = _message(sent[1], _honest(strategy, 1))  # the right shape, padded with 1 MiB
    arr = padded.content.array_records[wire.DELTA]["b"]
    padded.content.array_records[wire.DELTA]["b"] = Array(dtype=arr.dtype, shape=arr.shape,
                                                         stype=arr.stype, data=arr.data + bytes(2**20))
    honest = [_message(sent[n], _honest(strategy, n)) for n in (2, 3, 4)]
    strategy.aggregate_train(1, [big, padded, *honest])
    assert strategy.report.rejected[str(HOSTILE)] == "delta[w]: shape (600, 262144), expected (2, 2)"
    assert "delta[b]: 1048712 bytes, its shape and dtype need at most" in strategy.report.rejected["1"]
    assert decoded == [2, 2, 2]  # the three honest replies' Δ only (main decoded all five)


def test_the_default_bound_is_the_contracts_reply_size() -> None:
    strategy = _strategy("fedact")  # Δ and v: 2 records of w (2x2) and b (2,), float32
    expected = strategy.contract().reply_spec(SPEC)
    assert expected_bytes(expected) == 2 * (4 + 2) * 4
    assert reply_bound(0.0, expected) == 48 + 4 * NPY_HEADER  # main: 1024 MiB whatever the model
    assert reply_bound(2.0, expected) == 2 * 2**20
    assert strategy.cfg.federation.max_reply_mb == 0.0
    content = ArrayRecord({"w": torch.zeros(2, 2), "b": torch.zeros(2)})
    assert sum(len(a.data) for a in content.values()) <= 24 + 2 * NPY_HEADER  # np.save's real headers
    assert len(Array(np.zeros((2, 2), np.float32)).data) - 16 < NPY_HEADER


def test_each_replys_latency_is_in_the_round_record() -> None:
    """A client answering just under round-timeout slowed every round unseen (issue 21 §4)."""
    strategy = _strategy("fedavg")
    sent = _sent(strategy)
    replies = [_message(sent[n], _honest(strategy, n)) for n in range(1, 6)]
    for n, reply in zip(range(1, 6), replies, strict=True):
        reply.metadata.created_at = sent[n].metadata.created_at + (590.0 if n == HOSTILE else 2.0)
    strategy.aggregate_train(1, replies)
    assert strategy.report.latency == pytest.approx({"1": 2.0, "2": 2.0, "3": 2.0, "4": 2.0, "5": 590.0})
    assert strategy.report.metrics["latency-max"] == pytest.approx(590.0)
