"""Reference for benchmarks/bench_topk.py: the sampled-band top-k that local_update/topk.py
used before the sync-free radix selection (git 288d4e1; only this paragraph is new). It reads
counts back to the host (`int(count_nonzero)`, `nonzero`) at every call.

FedACT needs the exact top-⌊τD⌋ trust scores over ALL D coordinates at every local step. A full
`torch.kthvalue` over D = 5.4M costs several AdamW updates, so we first estimate the threshold
from a random sample, then find the exact k-th largest value inside a narrow band around the
estimate. The answer never depends on the sample (only the speed does): if the band misses the
k-th value we fall back to the exact full selection.

Cost per call, in passes over the D values: two comparisons into reused bool buffers, a count
and a `nonzero` of the band mask. Everything else (the k-th value, the ties, the sums for
TopMass) runs on the band, a few percent of D.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from adaptfl.local_update.workspace import Workspace, scratch

_SAMPLE = 1 << 15  # sample size for the threshold estimate
_SMALL = 1 << 17  # below this many coordinates a direct kthvalue is cheapest
_Z = 5.0  # band half-width in binomial standard deviations (miss probability ~1e-6)


def _sample_generator(device: torch.device) -> torch.Generator:
    # A fixed seed keeps runs reproducible in time as well as in value.
    return torch.Generator(device=device).manual_seed(0x5EED)


def _bounds(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A band [lo, hi] of values that holds the k-th largest of x (unless unlucky)."""
    n = x.numel()
    idx = torch.randint(n, (_SAMPLE,), device=x.device, generator=_sample_generator(x.device))
    sample = x[idx]
    q = 1.0 - k / n  # the threshold's quantile in ascending order
    half = _Z * math.sqrt(max(q * (1.0 - q), 1.0 / _SAMPLE) / _SAMPLE)
    i_lo = max(int((q - half) * _SAMPLE), 0)
    i_hi = min(int(math.ceil((q + half) * _SAMPLE)), _SAMPLE - 1)
    # Two order statistics of the sample; selecting them is cheaper than sorting it.
    return (torch.kthvalue(sample, i_lo + 1).values, torch.kthvalue(sample, i_hi + 1).values)


class _Band(NamedTuple):
    """The entries of x in a band [lo, hi] around the k-th largest, and how many lie above."""

    above: int  # #{x > hi}
    values: torch.Tensor  # the entries in [lo, hi]
    index: torch.Tensor | None  # their positions in x, ascending; None: `values` is all of x


def _band(x: torch.Tensor, k: int, ws: Workspace | None, tail: bool) -> _Band:
    """A band holding the k-th largest of x, which is then the (k - above)-th largest of its
    values. With `tail`, hi = +∞: above = 0 and the band holds all of the top k.
    """
    n = x.numel()
    if n <= _SMALL:
        return _Band(0, x, None)
    ws = scratch(ws)
    lo, hi = _bounds(x, k)
    inside = torch.ge(x, lo, out=ws.get("topk.inside", n, x, torch.bool))
    at_least_lo = None if tail else int(torch.count_nonzero(inside))
    if not tail:  # above = #{x >= lo} - #{lo <= x <= hi}: no pass for x > hi of its own
        inside.logical_and_(torch.le(x, hi, out=ws.get("topk.le", n, x, torch.bool)))
    index = inside.nonzero().squeeze(1)
    values = torch.index_select(x, 0, index)
    above = 0 if at_least_lo is None else at_least_lo - values.numel()
    # The k-th largest lies in [lo, hi] iff `above` < k <= above + |band|.
    if above < k <= above + values.numel():
        return _Band(above, values, index)
    return _Band(0, x, None)  # the sample misled us: select over all of x


def _kth(x: torch.Tensor, k: int, ws: Workspace | None = None,
         tail: bool = False) -> tuple[torch.Tensor, _Band]:
    """(t, band): t is the exact k-th largest of x."""
    band = _band(x, k, ws, tail)
    t = torch.kthvalue(band.values, band.values.numel() - (k - band.above) + 1).values
    return t, band


def kth_largest(x: torch.Tensor, k: int) -> torch.Tensor:
    """The k-th largest entry of the 1-D tensor `x` (1 <= k <= numel), exact."""
    n = x.numel()
    if not 1 <= k <= n:
        raise ValueError(f"k={k} must be in [1, {n}]")
    return _kth(x, k)[0]


def _ties_to_drop(t: torch.Tensor, band: _Band, k: int) -> torch.Tensor | None:
    """Positions of the entries equal to t that `x >= t` selects beyond k: the highest ones.

    Every entry equal to t lies in the band, so both the count and the positions come from it.
    """
    surplus = band.above + int(torch.count_nonzero(band.values >= t)) - k  # #{x >= t} - k
    if surplus <= 0:
        return None
    tied = torch.nonzero(band.values == t).squeeze(1)
    if band.index is not None:
        tied = band.index[tied]
    return tied[tied.numel() - surplus:]


def topk_mask(x: torch.Tensor, k: int, ws: Workspace | None = None) -> torch.Tensor:
    """Boolean mask of exactly k entries of 1-D `x`: the k largest, ties broken by lower index."""
    n = x.numel()
    if k <= 0:
        return torch.zeros(n, dtype=torch.bool, device=x.device)
    if k >= n:
        return torch.ones(n, dtype=torch.bool, device=x.device)
    t, band = _kth(x, k, ws)
    drop = _ties_to_drop(t, band, k)
    mask = x >= t
    if drop is not None:
        mask[drop] = False
    return mask


def topk_indicator_(x: torch.Tensor, k: int, ws: Workspace | None = None) -> torch.Tensor:
    """`topk_mask` as 1.0 / 0.0 written over `x` itself (saves a D-sized buffer and a pass)."""
    n = x.numel()
    if k <= 0:
        return x.zero_()
    if k >= n:
        return x.fill_(1.0)
    t, band = _kth(x, k, ws)
    drop = _ties_to_drop(t, band, k)  # before x is overwritten
    torch.ge(x, t, out=x)
    if drop is not None:
        x[drop] = 0.0
    return x


def topk_sum_positive(x: torch.Tensor, k: int, ws: Workspace | None = None) -> torch.Tensor:
    """Sum of max(x, 0) over the k largest entries (ties do not change the sum).

    Cheap for a small k (TopMass takes the top 1%): the sums run on the sampled tail only.
    """
    if k <= 0:
        return x.new_zeros(())
    if k >= x.numel():
        return x.clamp(min=0).sum()
    t, band = _kth(x, k, ws, tail=True)
    tail = band.values  # every entry > t is in it
    strictly = tail > t
    count = int(torch.count_nonzero(strictly))
    total = torch.where(strictly, tail, 0.0).clamp_(min=0).sum()
    return total + (k - count) * t.clamp(min=0)
