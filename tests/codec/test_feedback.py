"""Error feedback (feedback.py): over the rounds, what was sent plus what is still kept is what
the client had to send, exactly; the residual lives in the client's durable state and nothing
is stored without +ef."""

from __future__ import annotations

import pytest
import torch

from adaptfl.client_app.client_state import MemoryStore
from adaptfl.codec.feedback import RESIDUAL, encode_reply, residual_key
from adaptfl.codec.settings import Compression
from adaptfl.core import wire

F64 = torch.float64


class KeepingStore:
    """A durable store that gives back what was saved (MemoryStore's load finds nothing)."""

    def __init__(self) -> None:
        self.saved: dict[str, dict[str, torch.Tensor]] = {}
        self.loads: list[tuple[str, dict]] = []

    def load(self, name: str, expect=None):  # noqa: ANN001, ANN201
        self.loads.append((name, dict(expect or {})))
        found = self.saved.get(name)
        return ({k: v.clone() for k, v in found.items()} if found is not None else None), "memory"

    def save(self, name: str, tensors: dict[str, torch.Tensor]) -> None:
        self.saved[name] = {k: v.clone() for k, v in tensors.items()}


class RefusingStore:
    def load(self, name, expect=None):  # noqa: ANN001, ANN201
        raise AssertionError("loaded without +ef")

    def save(self, name, tensors):  # noqa: ANN001, ANN201
        raise AssertionError("saved without +ef")


SHAPES = {"w": (3, 7), "b": (5,)}


def _dyadic(round_: int) -> dict[str, torch.Tensor]:
    """Integers / 2^10 in [-0.5, 0.5]: float32 exactly, and float64 sums of them stay exact."""
    g = torch.Generator().manual_seed(100 + round_)
    return {n: torch.randint(-512, 513, s, generator=g).float() / 2**10 for n, s in SHAPES.items()}


def _decoded(compression, record: str, wire_arrays: dict) -> dict[str, torch.Tensor]:  # noqa: ANN001
    spec = {n: (s, torch.float32) for n, s in SHAPES.items()}
    return compression.of(record).decode(wire_arrays, spec, compression.codec_block)


@pytest.mark.parametrize("codec", ["int8+ef", "top25%:nf4+ef", "top10%+ef", "fp4+ef", "bf16+ef",
                                   "top40%:int8+ef", "int2+ef", "top30%:int2+ef", "rtop20%:nf4+ef",
                                   "rand25%:int8+ef", "rand30%+ef"])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_sent_plus_residual_telescopes_to_the_raw_updates_exactly(codec, rounding) -> None:
    compression = Compression.build({"codec-delta": codec, "codec-block": 8, "codec-rounding": rounding})
    store = KeepingStore()
    sent = {n: torch.zeros(s, dtype=F64) for n, s in SHAPES.items()}
    raw = {n: torch.zeros(s, dtype=F64) for n, s in SHAPES.items()}
    for r in range(1, 7):
        update = _dyadic(r)
        out, metrics = encode_reply({wire.DELTA: update}, compression, store,
                                    lambda name, r=r: compression.generator(0, r, "node-1", name))
        assert "w" not in out[wire.DELTA] and any("@" in k for k in out[wire.DELTA])
        for n, t in _decoded(compression, wire.DELTA, out[wire.DELTA]).items():
            sent[n] += t.double()
            raw[n] += update[n].double()
        residual = store.saved[RESIDUAL]
        assert set(residual) == {residual_key(wire.DELTA, n) for n in SHAPES}
        assert all(t.dtype == F64 for t in residual.values())
        norm = sum(float((t * t).sum()) for t in residual.values()) ** 0.5
        assert metrics[wire.EF_RESIDUAL] == pytest.approx(norm, rel=1e-12) and norm > 0
        for n in SHAPES:  # Σ sent + residual == Σ raw, every round
            assert torch.equal(sent[n] + residual[residual_key(wire.DELTA, n)], raw[n]), (codec, r, n)
    # and the residual fed back: without it the sums would differ (lossy codecs)
    assert any(not torch.equal(sent[n], raw[n]) for n in SHAPES)


def test_the_first_reply_starts_from_zero_and_the_second_adds_the_residual() -> None:
    compression = Compression.build({"codec-delta": "top10%+ef"})
    store = KeepingStore()
    first = _dyadic(1)
    out, _ = encode_reply({wire.DELTA: first}, compression, store, lambda name: None)
    assert store.loads[0] == (RESIDUAL, {})  # every record's; each checked on its own (below)
    assert torch.equal(_decoded(compression, wire.DELTA, out[wire.DELTA])["w"],
                       compression.of(wire.DELTA).round_trip(first, 64)["w"])  # C(x + 0)
    kept = store.saved[RESIDUAL]["delta/w"].clone()
    second = _dyadic(2)
    out, _ = encode_reply({wire.DELTA: second}, compression, store, lambda name: None)
    target = (second["w"].double() + kept).float()
    assert torch.equal(_decoded(compression, wire.DELTA, out[wire.DELTA])["w"],
                       compression.of(wire.DELTA).round_trip({"w": target}, 64)["w"])


def test_memory_store_finds_nothing_so_each_reply_starts_from_zero() -> None:
    compression = Compression.build({"codec-delta": "int8+ef", "codec-block": 8})
    store = MemoryStore()
    update = _dyadic(1)
    a, _ = encode_reply({wire.DELTA: update}, compression, store, lambda name: None)
    b, _ = encode_reply({wire.DELTA: update}, compression, store, lambda name: None)
    assert all(torch.equal(a[wire.DELTA][k], b[wire.DELTA][k]) for k in a[wire.DELTA])
    assert set(store.saved[RESIDUAL]) == {"delta/w", "delta/b"}


@pytest.mark.parametrize("values", [{"codec": "int8"}, {"codec-delta": "top10%:nf4"},
                                    {"codec": "fp32"}, {"codec": "nf4+ef", "codec-delta": "int8"}])
def test_without_ef_nothing_is_loaded_or_stored(values) -> None:
    compression = Compression.build(values)
    records = {wire.DELTA: _dyadic(1), wire.V_LOCAL: {n: t.abs() for n, t in _dyadic(2).items()}}
    if values.get("codec") == "nf4+ef":  # +ef on v, Δ's own codec has none: only v's residual
        store = KeepingStore()
        out, metrics = encode_reply(records, compression, store, lambda name: None)
        assert set(store.saved[RESIDUAL]) == {"v/w", "v/b"} and wire.EF_RESIDUAL in metrics
        return
    out, metrics = encode_reply(records, compression, RefusingStore(), lambda name: None)
    assert metrics == {}
    assert set(out) == {wire.DELTA, wire.V_LOCAL}


def test_integer_arrays_pass_through_and_get_no_residual() -> None:
    compression = Compression.build({"codec-delta": "int8+ef"})
    store = KeepingStore()
    steps = torch.tensor([3, 4], dtype=torch.int64)
    out, _ = encode_reply({wire.DELTA: {"w": _dyadic(1)["w"], "n": steps}}, compression, store,
                          lambda name: None)
    assert torch.equal(out[wire.DELTA]["n"], steps)
    assert set(store.saved[RESIDUAL]) == {"delta/w"}


def test_a_record_left_out_of_a_reply_keeps_its_residual_and_the_others_go_on() -> None:
    """v with error feedback sent in rounds 1 and 3 only (v-sync-every=2): round 2 feeds Δ's
    residual back and keeps v's as it was; round 3 adds v's round-1 residual to v."""
    compression = Compression.build({"codec": "int8+ef", "codec-block": 8})
    store = KeepingStore()
    v = {n: t.abs() for n, t in _dyadic(9).items()}
    encode_reply({wire.DELTA: _dyadic(1), wire.V_LOCAL: v}, compression, store, lambda name: None)
    after_1 = {k: t.clone() for k, t in store.saved[RESIDUAL].items()}
    second = _dyadic(2)
    out, _ = encode_reply({wire.DELTA: second}, compression, store, lambda name: None)
    target = {n: (second[n].double() + after_1[f"delta/{n}"]).float() for n in SHAPES}
    assert all(torch.equal(_decoded(compression, wire.DELTA, out[wire.DELTA])[n],
                           compression.of(wire.DELTA).round_trip(target, 8)[n]) for n in SHAPES)
    assert all(torch.equal(store.saved[RESIDUAL][f"v/{n}"], after_1[f"v/{n}"]) for n in SHAPES)
    out, _ = encode_reply({wire.DELTA: _dyadic(3), wire.V_LOCAL: v}, compression, store, lambda name: None)
    target = {n: (v[n].double() + after_1[f"v/{n}"]).float() for n in SHAPES}
    assert all(torch.equal(_decoded(compression, wire.V_LOCAL, out[wire.V_LOCAL])[n],
                           compression.of(wire.V_LOCAL).round_trip(target, 8)[n]) for n in SHAPES)


def test_a_records_mis_shaped_residual_starts_from_zero_alone() -> None:
    compression = Compression.build({"codec": "int8+ef", "codec-block": 8})
    store = KeepingStore()
    v = {n: t.abs() for n, t in _dyadic(9).items()}
    encode_reply({wire.DELTA: _dyadic(1), wire.V_LOCAL: v}, compression, store, lambda name: None)
    kept_delta = {n: store.saved[RESIDUAL][f"delta/{n}"].clone() for n in SHAPES}
    store.saved[RESIDUAL]["v/w"] = torch.zeros(2, 2, dtype=F64)  # another model's shape
    second = _dyadic(2)
    out, _ = encode_reply({wire.DELTA: second, wire.V_LOCAL: v}, compression, store, lambda name: None)
    delta_target = {n: (second[n].double() + kept_delta[n]).float() for n in SHAPES}
    assert all(torch.equal(_decoded(compression, wire.DELTA, out[wire.DELTA])[n],
                           compression.of(wire.DELTA).round_trip(delta_target, 8)[n]) for n in SHAPES)
    assert all(torch.equal(_decoded(compression, wire.V_LOCAL, out[wire.V_LOCAL])[n],
                           compression.of(wire.V_LOCAL).round_trip(v, 8)[n]) for n in SHAPES)  # C(v + 0)
