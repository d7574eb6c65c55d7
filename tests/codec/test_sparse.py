"""The cheap-position codecs against hand-computed oracles: 2-bit values (int2), positions as a
bitmap or Elias-Fano (and `auto` picking the smallest), top-k over a whole record (rtop), and
seeded random-k (rand: the receiver draws the sender's positions from one 64-bit seed)."""

from __future__ import annotations

import pytest
import torch

from adaptfl.codec import positions as layout
from adaptfl.codec.codec import Codec
from adaptfl.codec.values import MalformedEncoding, dequantize, quantize

F32 = torch.float32
U8 = torch.uint8


def _t(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=F32)


def test_int2_codes_scales_and_packing() -> None:
    # block 4: s = 4, t = [1, -.25, 0, .225] -> levels (-1, -1/4, 1/4, 1) codes 3, 1, 2 (0 goes up), 2
    # packed first-lowest: 3 | 1<<2 | 2<<4 | 2<<6 = 167; the all-zero block: scale 2^-149, codes 2 -> 170
    x = _t([4.0, -1.0, 0.0, 0.9, 0.0, 0.0, 0.0, 0.0, 1.0, -3.0])
    parts = quantize(x, "int2", 4)
    # the last block [1, -3]: s = 3, 1/3 -> 1/4 (code 2), -1 (code 0); the padding codes are 0
    assert parts["q"].tolist() == [167, 170, 2 | 0 << 2]
    assert parts["s"].tolist() == [4.0, 2.0 ** -149, 3.0]
    got = dequantize(parts, "int2", 10, 4)
    assert got.tolist() == [4.0, -1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.75, -3.0]
    again = quantize(got, "int2", 4)  # idempotent: the server can keep what clients decode
    assert all(torch.equal(again[p], parts[p]) for p in parts)
    assert Codec.parse("int2").parts(10, 4) == {"q": ((3,), torch.uint8), "s": ((3,), F32)}


def test_bitmap_and_elias_fano_bytes() -> None:
    # bitmap of [0, 3, 9] in 10: bits 0, 3 -> 9; bit 9 -> byte 1 bit 1 -> 2
    assert layout.encode(torch.tensor([0, 3, 9]), 10, "bitmap")["ib"].tolist() == [9, 2]
    # Elias-Fano of [2, 9, 17] in 20: b = floor(log2(20/3)) = 2; low bits 2, 1, 1 (LSB first)
    # -> stream 0,1 1,0 1,0 -> 2 + 4 + 16 = 22; high 0, 2, 4 plus i -> bits 0, 3, 6 of 3 + 19>>2 = 7
    ef = layout.encode(torch.tensor([2, 9, 17]), 20, "elias-fano")
    assert ef["il"].tolist() == [22] and ef["ih"].tolist() == [1 + 8 + 64]
    assert layout.decode(ef, 20, 3, "elias-fano").tolist() == [2, 9, 17]
    assert layout.decode({"ib": torch.tensor([9, 2], dtype=U8)}, 10, 3, "bitmap").tolist() == [0, 3, 9]


@pytest.mark.parametrize("n,k,chosen", [(20, 3, "elias-fano"), (1000, 500, "bitmap"), (3, 1, "bitmap"),
                                        (184_586, 1846, "elias-fano"), (10**6, 1, "int32")])
def test_auto_picks_the_smallest_layout(n, k, chosen) -> None:
    sizes = {name: sum(math_prod(s) * torch.empty((), dtype=d).element_size()
                       for s, d in layout.spec(name, n, k).values()) for name in layout.LAYOUTS[1:]}
    assert layout.resolve("auto", n, k) == chosen == min(sizes, key=lambda name: sizes[name])


def math_prod(shape: tuple[int, ...]) -> int:
    out = 1
    for s in shape:
        out *= s
    return out


@pytest.mark.parametrize("name", ["bitmap", "elias-fano", "auto"])
def test_top_k_with_cheap_positions_decodes_like_int32(name) -> None:
    x = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    cheap, plain = Codec.parse("top7%:int2"), Codec.parse("top7%:int2")
    cheap = Codec(cheap.values, cheap.top, positions=name)
    got = cheap.decode_array(cheap.encode_array(x, 64), (1000,), 64)
    assert torch.equal(got, plain.decode_array(plain.encode_array(x, 64), (1000,), 64))
    assert int((got != 0).sum()) == 70


@pytest.mark.parametrize("name,parts", [
    ("bitmap", {"ib": torch.tensor([9, 0], dtype=U8)}),  # 2 set, 3 declared
    ("bitmap", {"ib": torch.tensor([9, 6], dtype=U8)}),  # bit 10: padding
    ("elias-fano", {"il": torch.tensor([22], dtype=U8), "ih": torch.tensor([1 + 8], dtype=U8)}),
    ("elias-fano", {"il": torch.tensor([22], dtype=U8), "ih": torch.tensor([1 + 8 + 128], dtype=U8)}),
    ("elias-fano", {"il": torch.tensor([22 + 64], dtype=U8), "ih": torch.tensor([73], dtype=U8)}),
])
def test_malformed_positions_are_refused(name, parts) -> None:
    n = 10 if name == "bitmap" else 20
    with pytest.raises(MalformedEncoding):
        layout.decode(parts, n, 3, name)


def test_record_top_k_keeps_one_threshold_for_all_arrays() -> None:
    # 7 values, rtop30%: k = ceil(2.1) = 3 -> 5, 6, 7 (all of a), none of b; per array: 1 of a, 2 of b
    record = {"b": _t([0.1, 0.2, 0.3, 0.4]), "a": _t([5.0, 6.0, 7.0]), "n": torch.arange(2)}
    codec = Codec("fp32", 30.0, select="rtop")
    spec = {n: (tuple(t.shape), t.dtype) for n, t in record.items()}
    assert codec.record_spec(spec, 64) == {"n": ((2,), torch.int64), "@i": ((3,), torch.int32),
                                           "@v": ((3,), F32)}
    encoded = codec.encode(record, 64)
    assert encoded["@i"].tolist() == [0, 1, 2] and encoded["@v"].tolist() == [5.0, 6.0, 7.0]  # a, then b
    got = codec.decode(encoded, spec, 64)
    assert got["a"].tolist() == [5.0, 6.0, 7.0] and got["b"].tolist() == [0.0] * 4
    assert torch.equal(got["n"], torch.arange(2))
    per_array = Codec("fp32", 30.0).round_trip(record, 64)
    assert per_array["a"].tolist() == [0.0, 0.0, 7.0]
    assert (per_array["b"] != 0).tolist() == [False, False, True, True]


def _record() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return {"w": torch.randn(3, 7, generator=g), "b": torch.randn(5, generator=g)}


def test_random_k_sends_a_seed_and_no_positions_and_the_receiver_draws_the_same() -> None:
    codec = Codec.parse("rand25%")
    record = _record()
    spec = {n: (tuple(t.shape), t.dtype) for n, t in record.items()}
    # w: 21 values, k = ceil(5.25) = 6; b: 5, k = 2; positions: none, only the seed
    assert codec.record_spec(spec, 64) == {"w@v": ((6,), F32), "b@v": ((2,), F32),
                                           "@seed": ((1,), torch.int64)}
    encoded = codec.encode(record, 64)
    assert set(encoded) == {"w@v", "b@v", "@seed"}
    wire = {n: t.clone() for n, t in encoded.items()}  # what the receiver has: no state shared but the code
    got = codec.decode(wire, spec, 64)
    for name, t in record.items():
        kept = torch.nonzero(got[name].reshape(-1)).reshape(-1)
        assert kept.numel() == encoded[f"{name}@v"].numel()
        # unbiased: the kept values scaled by n/k, at the positions the sender took them from
        n, k = t.numel(), kept.numel()
        assert torch.allclose(got[name].reshape(-1)[kept], t.reshape(-1)[kept] * (n / k), rtol=1e-6)
        assert torch.equal(encoded[f"{name}@v"], t.reshape(-1)[kept])
    # another seed draws other positions; with +ef nothing is scaled (the residual repays)
    wire["@seed"] = wire["@seed"] + 1
    assert not torch.equal(codec.decode(wire, spec, 64)["w"] != 0, got["w"] != 0)
    fed_back = Codec.parse("rand25%+ef").round_trip(record, 64)
    kept = fed_back["w"] != 0
    assert torch.equal(fed_back["w"][kept], record["w"][kept])


def test_random_k_is_unbiased() -> None:
    x = _t([1.0, -2.0, 0.5, 4.0, 0.0, -1.0, 3.0, 2.0])
    codec = Codec.parse("rand25%")
    draws = [codec.round_trip({"x": x}, 64, torch.Generator().manual_seed(s))["x"] for s in range(1200)]
    mean = torch.stack(draws).mean(dim=0)
    assert torch.allclose(mean, x, atol=0.4), mean  # sd of one coordinate's mean: |x|·sqrt(3/1200) ≤ 0.2
    assert all(int((d != 0).sum()) <= 2 for d in draws[:50])


def test_new_codecs_parse_and_print() -> None:
    for text in ("int2", "int2+ef", "rtop5%:int2+ef", "rand10%:nf4+ef", "top1%:int2"):
        assert str(Codec.parse(text)) == text
    assert Codec.parse("rand10%:nf4+ef") == Codec("nf4", 10.0, True, "rand")
    with pytest.raises(ValueError, match="rtop<P>%"):
        Codec.parse("rnd10%")
