"""Properties of every codec on random tensors: encoding what was decoded changes nothing (the
server keeps, and re-sends, what its clients decode), stochastic rounding is unbiased, and
rounding to nearest errs by at most half the gap between the two levels around a value."""

from __future__ import annotations

import bisect
import math

import pytest
import torch

from adaptfl.codec.codec import Codec
from adaptfl.codec.values import FP4, NF4

F32 = torch.float32
CODECS = ["fp32", "bf16", "fp16", "int8", "nf4", "fp4", "top10%", "top33%:int8", "top50%:nf4",
          "top5%:fp4", "top20%:bf16", "top1%:fp16"]
SIZES = [1, 3, 7, 63, 65, 129, 333]


def _x(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g) * torch.exp(torch.randn(n, generator=g))  # mixed magnitudes


def _rt(codec: Codec, x: torch.Tensor, block: int, generator=None) -> torch.Tensor:  # noqa: ANN001
    return codec.round_trip({"x": x}, block, generator)["x"]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32)


@pytest.mark.parametrize("text", CODECS)
@pytest.mark.parametrize("stochastic", [False, True])
def test_decode_encode_is_idempotent_bit_for_bit(text, stochastic) -> None:
    """decode(encode(y)) == y bit for bit for what the server keeps of a broadcast record (y =
    Codec.settled): for every dense codec that is the round trip itself, with the first encode
    stochastic or not (FP4's -0 and +0 included: one code for both)."""
    codec = Codec.parse(text)
    for n in SIZES:
        for block in (5, 64):
            x = _x(n, 7 * n + block).reshape(-1, 1) if n % 2 else _x(n, n)
            g = torch.Generator().manual_seed(n) if stochastic else None
            kept = codec.settled({"x": x}, block, g)["x"]
            assert kept.shape == x.shape and kept.dtype == F32
            assert torch.equal(_bits(_rt(codec, kept, block)), _bits(kept)), (text, n, block)
            if not codec.top:  # dense: the first round trip is already settled
                g = torch.Generator().manual_seed(n) if stochastic else None
                once = _rt(codec, x, block, g)
                assert torch.equal(_bits(once), _bits(kept))
                assert torch.equal(_bits(_rt(codec, once, block)), _bits(once)), (text, n, block)


def test_topk_round_trip_alone_is_not_idempotent_when_a_kept_value_decodes_to_zero() -> None:
    """Why the server settles (Codec.settled): a value top-k keeps may decode to 0 (nf4: |x/s|
    < 0.04); re-encoding the decode then keeps another zero instead, which shifts the kept
    values' blocks and so their scales and values. Seen on this tensor of the sweep above."""
    codec = Codec.parse("top50%:nf4")
    x = _x(129, 7 * 129 + 5)
    once = _rt(codec, x, 5)
    assert int((once != 0).sum()) < codec.kept(129)  # a kept value decoded to 0
    assert not torch.equal(_rt(codec, once, 5), once)
    kept = codec.settled({"x": x}, 5)["x"]
    assert torch.equal(_rt(codec, kept, 5), kept)


def test_fp4_stochastic_rounding_never_writes_minus_zero() -> None:
    codec = Codec.parse("fp4")
    x = torch.linspace(-0.05, 0.05, 101)
    x[0] = 1.0  # s = 1: everything else lies between the levels ±1/12 and 0
    for seed in range(20):
        parts = codec.encode_array(x, 128, torch.Generator().manual_seed(seed))
        codes = torch.stack([parts["q"] & 0x0F, parts["q"] >> 4], dim=1).reshape(-1)[:101]
        assert 8 not in codes.tolist()  # code 8 is -0
        assert not torch.signbit(codec.decode_array(parts, (101,), 128)[x >= 0]).any()


def test_idempotence_is_a_real_check() -> None:
    """Rounding that moves a value on a level (here: shrinking the scale) fails the comparison
    above: it is not vacuous."""
    x = _x(65, 1)
    once = _rt(Codec.parse("int8"), x, 64)
    assert not torch.equal(_rt(Codec.parse("int8"), once * 0.999, 64), once * 0.999)


SEEDS = 1200


def _mean_of_seeds(codec: Codec, x: torch.Tensor, block: int) -> torch.Tensor:
    total = torch.zeros_like(x, dtype=torch.float64)
    for seed in range(SEEDS):
        total += _rt(codec, x, block, torch.Generator().manual_seed(seed)).double()
    return total / SEEDS


def _bracket(levels: list[float], t: float) -> float:
    """The gap between the two levels around t (0 on a level)."""
    i = bisect.bisect_left(levels, t)
    return 0.0 if levels[min(i, len(levels) - 1)] == t else levels[i] - levels[i - 1]


def _gaps(kind: str, x: torch.Tensor, block: int) -> torch.Tensor:
    """Per value, the gap between the two representable values around it (in x's units)."""
    if kind in ("bf16", "fp16"):  # x in ±[1, 2): a fixed spacing of 2^-7 or 2^-10
        return torch.full_like(x, 2.0**-7 if kind == "bf16" else 2.0**-10, dtype=torch.float64)
    rows = x.double().view(-1, block)
    s = rows.abs().amax(dim=1, keepdim=True)
    t = (rows / s).reshape(-1)
    s = s.expand_as(rows).reshape(-1)
    if kind == "int8":
        return s / 127
    levels = sorted(set(NF4 if kind == "nf4" else FP4))
    return torch.tensor([_bracket(levels, float(v)) for v in t], dtype=torch.float64) * s


@pytest.mark.parametrize("kind", ["int8", "nf4", "fp4", "bf16", "fp16"])
def test_stochastic_rounding_is_unbiased(kind) -> None:
    """Each decoded value is one of the two levels around x, the upper with probability
    (x − lo)/gap: a Bernoulli scaled by the gap, so its standard deviation is at most gap/2 and
    the mean of N seeds' decodes has standard deviation ≤ gap/(2√N). The tolerance is 5 of those
    (N = 1200: gap/13.9) plus float32 slack; rounding to nearest is off by up to gap/2, so it
    fails the same check (asserted below)."""
    block = 16
    g = torch.Generator().manual_seed(3)
    x = (1.0 + torch.rand(64, generator=g)) * torch.where(torch.rand(64, generator=g) < 0.5, -1.0, 1.0)
    codec = Codec.parse(kind)
    gaps = _gaps(kind, x, block)
    tolerance = 5 * gaps / (2 * math.sqrt(SEEDS)) + 1e-6 * x.abs().double()
    mean = _mean_of_seeds(codec, x, block)
    assert ((mean - x.double()).abs() <= tolerance).all(), float(((mean - x.double()).abs() / gaps).max())
    nearest = _rt(codec, x, block).double()
    assert ((nearest - x.double()).abs() > tolerance).sum() > 16  # the check can tell the two apart


@pytest.mark.parametrize("kind", ["int8", "nf4", "fp4", "bf16", "fp16"])
def test_nearest_rounding_errs_at_most_half_the_gap(kind) -> None:
    block = 16
    g = torch.Generator().manual_seed(11)
    x = (1.0 + torch.rand(4096, generator=g)) * torch.where(torch.rand(4096, generator=g) < 0.5, -1.0, 1.0)
    x[:block] = 0.0  # an all-zero block: s = 1, every value exact
    if kind in ("int8", "nf4", "fp4"):
        x[block:2 * block] *= 1e-3  # a small block: its own scale
    err = (_rt(Codec.parse(kind), x, block).double() - x.double()).abs()
    bound = _gaps(kind, x, block) / 2 * (1 + 1e-6) + 1e-7 * x.abs().double()
    assert (err <= bound).all(), float((err / bound).max())
    assert err[:block].max() == 0.0
    assert err.max() > 0.25 * float(bound.max())  # lossy indeed: the bound is not met trivially


def test_topk_keeps_the_largest_and_zeroes_the_rest() -> None:
    x = _x(200, 5)
    kept = _rt(Codec.parse("top10%"), x, 64)
    assert int((kept != 0).sum()) == 20
    assert float(x[kept == 0].abs().max()) <= float(x[kept != 0].abs().min())
    assert torch.equal(kept[kept != 0], x[kept != 0])  # fp32 values: exact
