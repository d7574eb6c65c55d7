"""How one flat float32 array's values cross the wire: lossless, half precision, or blockwise
absmax quantization to 8 or 4 bits. Pure functions: `quantize` (client or server), `dequantize`
(the receiver; raises `MalformedEncoding` on anything an honest encoder cannot produce) and
`parts_spec` (the shapes and dtypes the receiver expects, checked before anything is decoded).

    fp32   the values themselves (today's bytes)
    bf16   bfloat16, sent as its int16 bits (numpy has no bfloat16)
    fp16   IEEE half precision
    int8   blocks of `block` values; per block its absmax s (float32) and q = round(127·x/s)
    nf4    the same blocks, each value the nearest of NormalFloat4's 16 levels × s (QLoRA)
    fp4    the same with FP4 E2M1's 16 levels (±{0, 0.5, 1, 1.5, 2, 3, 4, 6}/6) × s
    int2   the same blocks at 2 bits, four per byte: the levels ±{1/4, 1} × s (SparseLoCo's
           2-bit values, Sarfi et al. 2025, meant for error feedback, which repays the error)

The absmax of each block is kept exactly (the largest value decodes to ±s, since every
codebook ends at ±1): so re-encoding decoded values gives back the same codes and scales, and
the server can keep what its clients decode (it re-encodes its stored state every round, and
after a resume). An all-zero block is sent with s = 1 (a scale is always positive, so a zero
or negative one marks a malformed encoding). Stochastic rounding picks the upper neighbour with
probability (x − lo)/(hi − lo): unbiased, and a value on a level stays there.

Why no library kernel: torchao's NF4Tensor double-quantizes its scales inside a tensor subclass
(not a pair of arrays a receiver can check) and pins torch versions; bitsandbytes' blockwise
quantizers target CUDA. The kernels here are one bucketize and one gather per array, in torch,
on whatever device the values are (docs/compression.md measures their cost).
"""

from __future__ import annotations

import math

import torch

Spec = dict[str, tuple[tuple[int, ...], torch.dtype]]  # part name -> (shape, dtype)

# NormalFloat4 (Dettmers et al., QLoRA, 2023, appendix E): quantiles of N(0, 1) scaled to [-1, 1]
NF4 = (-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
       -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
       0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
       0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0)
# FP4 E2M1 (OCP Microscaling spec v1.0): codes 0-7 positive, 8-15 their negatives (8 is -0)
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
FP4 = tuple(v / 6.0 for v in _E2M1) + tuple(-v / 6.0 for v in _E2M1)
# 2 bits: symmetric, no zero level (a zero goes to +1/4·s, so v >= 0 stays >= 0); an all-zero
# block gets the smallest subnormal scale 2^-149, so it decodes to 2^-151 rounded: exactly 0
INT2 = (-1.0, -0.25, 0.25, 1.0)
CODEBOOKS = {"nf4": NF4, "fp4": FP4, "int2": INT2}
BITS = {"nf4": 4, "fp4": 4, "int2": 2}
KINDS = ("fp32", "bf16", "fp16", "int8", "nf4", "fp4", "int2")
_TINY = 2.0 ** -149  # int2's scale of an all-zero block
INT8_MAX = 127


class MalformedEncoding(ValueError):
    """An encoding no honest encoder produces (the message says what is wrong)."""


def parts_spec(kind: str, numel: int, block: int) -> Spec:
    """The arrays an encoding of `numel` values consists of ("" is the values themselves)."""
    blocks = (math.ceil(numel / block),)
    if kind == "fp32":
        return {"": ((numel,), torch.float32)}
    if kind == "bf16":
        return {"bf16": ((numel,), torch.int16)}
    if kind == "fp16":
        return {"fp16": ((numel,), torch.float16)}
    if kind == "int8":
        return {"q": ((numel,), torch.int8), "s": (blocks, torch.float32)}
    if kind in CODEBOOKS:
        return {"q": ((math.ceil(numel * BITS[kind] / 8),), torch.uint8), "s": (blocks, torch.float32)}
    raise ValueError(f"unknown value codec {kind!r}: choose one of {list(KINDS)}")


def quantize(x: torch.Tensor, kind: str, block: int, generator: torch.Generator | None = None
             ) -> dict[str, torch.Tensor]:
    """Encode the flat float32 `x`; `generator`: stochastic rounding (None: to nearest)."""
    if kind == "fp32":
        return {"": x}
    if kind in ("bf16", "fp16"):
        dtype = torch.bfloat16 if kind == "bf16" else torch.float16
        y = _round_float(x, dtype, generator)
        return {"bf16": y.view(torch.int16)} if kind == "bf16" else {"fp16": y}
    t, scales = _normalized(x, block, _TINY if kind == "int2" else 1.0)
    if kind == "int8":
        scaled = t * INT8_MAX
        q = torch.round(scaled) if generator is None else torch.floor(scaled + _uniform(scaled, generator))
        return {"q": q.clamp(-INT8_MAX, INT8_MAX).to(torch.int8)[:x.numel()], "s": scales}
    levels = torch.tensor(CODEBOOKS[kind], dtype=torch.float32, device=x.device)
    codes = _nearest_code(t, levels, kind == "int2") if generator is None \
        else _stochastic_code(t, levels, generator)
    return {"q": _pack(codes[:x.numel()], BITS[kind]), "s": scales}


def dequantize(parts: dict[str, torch.Tensor], kind: str, numel: int, block: int) -> torch.Tensor:
    """The flat float32 values of an encoding whose parts match `parts_spec` (checked by the
    caller); raises MalformedEncoding on scales or codes outside what `quantize` writes."""
    if kind == "fp32":
        return parts[""]
    if kind == "bf16":
        return parts["bf16"].view(torch.bfloat16).to(torch.float32)
    if kind == "fp16":
        return parts["fp16"].to(torch.float32)
    scales = parts["s"]
    if not bool(torch.isfinite(scales).all()) or (scales.numel() and float(scales.min()) <= 0.0):
        raise MalformedEncoding("block scales must be finite and > 0")
    expanded = scales.repeat_interleave(block)[:numel]
    if kind == "int8":
        q = parts["q"]
        if q.numel() and int(q.min()) < -INT8_MAX:
            raise MalformedEncoding(f"int8 code {int(q.min())} outside [-127, 127]")
        return (q.to(torch.float32) / INT8_MAX) * expanded
    levels = torch.tensor(CODEBOOKS[kind], dtype=torch.float32, device=scales.device)
    return levels[_unpack(parts["q"], numel, BITS[kind])] * expanded


# --- the pieces ---------------------------------------------------------------------------------

def _normalized(x: torch.Tensor, block: int, zero_scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """x padded to whole blocks and divided by each block's absmax (`zero_scale` for an all-zero
    block)."""
    n = x.numel()
    padded = torch.zeros(math.ceil(n / block) * block, dtype=torch.float32, device=x.device)
    padded[:n] = x
    rows = padded.view(-1, block)
    absmax = rows.abs().amax(dim=1)
    scales = torch.where(absmax > 0, absmax, torch.full_like(absmax, zero_scale))
    # the absmax value itself must map to exactly ±1 (x / x == 1 in IEEE arithmetic)
    return (rows / scales[:, None]).reshape(-1), scales


def _uniform(like: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    return torch.rand(like.shape, generator=generator, dtype=torch.float32).to(like.device)


def _nearest_code(t: torch.Tensor, levels: torch.Tensor, up: bool = False) -> torch.Tensor:
    """The code of the nearest level: the number of midpoints below t among the sorted levels,
    mapped back to the codebook's order (FP4's codes 8-15 are its negatives). `up`: a value on
    a midpoint takes the upper level (int2's 0 goes to +1/4, never below)."""
    order = torch.argsort(levels, stable=True)
    ranked = levels[order]
    return _first_codes(levels)[order[torch.bucketize(t, (ranked[1:] + ranked[:-1]) / 2, right=up)]]


def _first_codes(levels: torch.Tensor) -> torch.Tensor:
    """code -> the first code of its level: a level written twice (FP4's +0 and -0) always gets
    its first, so a value's code, and its decoded bits, are a function of the value."""
    values = levels.tolist()
    return torch.tensor([values.index(v) for v in values], device=levels.device)


def _stochastic_code(t: torch.Tensor, levels: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    order = torch.argsort(levels)
    ranked = levels[order]
    hi = torch.bucketize(t, ranked).clamp(1, len(ranked) - 1)  # first level >= t
    lo = hi - 1
    gap = ranked[hi] - ranked[lo]
    up = (t - ranked[lo]) / torch.where(gap > 0, gap, torch.ones_like(gap))
    pick = torch.where(_uniform(t, generator) < up, hi, lo)
    on_level = ranked[hi] == t  # exactly on a level (the absmax): keep it
    return _first_codes(levels)[order[torch.where(on_level, hi, pick)]]


def _round_float(x: torch.Tensor, dtype: torch.dtype, generator: torch.Generator | None) -> torch.Tensor:
    nearest = x.to(dtype)
    if generator is None:
        return nearest
    back = nearest.to(torch.float32)
    inf = torch.full_like(nearest, float("inf"))
    below = torch.where(back > x, torch.nextafter(nearest, -inf), nearest)
    above = torch.where(back > x, nearest, torch.nextafter(nearest, inf))
    lo, hi = below.to(torch.float32), above.to(torch.float32)
    gap = hi - lo
    up = torch.where(gap > 0, (x - lo) / torch.where(gap > 0, gap, torch.ones_like(gap)), torch.zeros_like(x))
    return torch.where(_uniform(x, generator) < up, above, below)


def _pack(codes: torch.Tensor, bits: int = 4) -> torch.Tensor:
    """8/bits codes per byte, the first in the lowest bits (4 bits: even positions low nibble)."""
    per = 8 // bits
    c = codes.to(torch.uint8)
    if c.numel() % per:
        c = torch.cat([c, c.new_zeros(per - c.numel() % per)])
    groups = c.view(-1, per)
    out = groups[:, 0].clone()
    for j in range(1, per):
        out |= groups[:, j] << (bits * j)
    return out


def _unpack(packed: torch.Tensor, numel: int, bits: int = 4) -> torch.Tensor:
    mask = (1 << bits) - 1
    every = torch.stack([(packed >> (bits * j)) & mask for j in range(8 // bits)], dim=1).reshape(-1)
    return every[:numel].to(torch.int64)
