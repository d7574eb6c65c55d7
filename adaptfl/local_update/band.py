"""CPU: the exact k-th largest by counting inside a band of values, reading counts on the host.

The radix selection (radix.py) runs a fixed kernel sequence so that a GPU never waits for the
host: two histogram passes over all D entries, each scattering every entry into 65,536 bins,
and the bins' fixed cost dominates small models. A CPU has nothing to wait for, so here the
selection may branch on counts:

1. A band [lo, hi] that likely holds the k-th largest: around the threshold this selection
   (same memory, D, k and dtype, same workspace) found at the previous call, since the τ-quantile of
   the trust scores often moves little between local steps; at the first call, or when that
   band misses (the scores' scale jumps with the batch), between two order statistics of a
   strided sample of the current scores (±5 binomial standard deviations).
2. #{x > hi}, and the positions of the entries in [lo, hi] (two compares, one count, and a
   `nonzero` over the mask's int64 words, then over the words that hold any). If the k-th
   largest lies in the band it is the (k - #above)-th largest of the band's entries, found
   by numpy's partition (`torch.kthvalue` for 16-bit floats); the entries tied with it that
   the top k leaves out are the highest-indexed
   ones, all inside the band.
3. If both bands miss, `select` returns None and the caller runs the radix selection. The
   answer is exact either way; the bands decide only the speed. The next band is centred on
   the new threshold, its width scaled so that it holds about `_TARGET` of the entries, and
   widened after a miss.

FedACT's native pass (step/native.py) counts the scores as it forms them, without storing them:
it takes the first band from `previous_band`, selects in C, and reports back through `counted`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch

from adaptfl.local_update.workspace import Workspace

_SAMPLE = 1 << 14  # strided sample for the first band
_Z = 5.0  # its half-width in binomial standard deviations of the sampled quantile
_TARGET = 1 / 128  # share of the entries a band should hold (at least `_MIN_BAND`)
_MIN_BAND = 4096  # 1,024 missed 2 of 5 steps of the MLP (50,890 entries): 22 % slower a step
_GROW = 4.0  # the most a band widens or narrows from one call to the next
_NUMPY = (torch.float32, torch.float64)  # `_pick` selects these with numpy


class Selection(NamedTuple):
    """The k-th largest t (a Python float, exactly the entry's value; +0.0 for a zero) and the
    positions of the entries equal to t that the top k leaves out (the highest-indexed ties),
    or None if it keeps them all."""

    t: float
    drop: torch.Tensor | None


def _sample_band(x: torch.Tensor, k: int) -> tuple[float, float]:
    """Two order statistics of a strided sample around the k-th largest's quantile."""
    n = x.numel()
    sample = x[:: max(n // _SAMPLE, 1)].clone()
    m = sample.numel()
    q = 1.0 - k / n  # the threshold's quantile in ascending order
    half = _Z * math.sqrt(max(q * (1.0 - q), 1.0 / m) / m)
    i_lo, i_hi = int((q - half) * m), math.ceil((q + half) * m)
    wanted = [i - 1 for i in (i_lo, i_hi) if 1 <= i <= m]  # 0-based ranks
    if sample.dtype in _NUMPY and sample.device.type == "cpu" and not sample.isnan().any():
        # one partition for both ranks: a third of two torch.kthvalue calls on a CPU
        ranked = np.partition(sample.numpy(), wanted) if wanted else sample.numpy()
        value = {i: float(ranked[i]) for i in wanted}
    else:
        value = {i: float(torch.kthvalue(sample, i + 1).values) for i in wanted}
    lo = -math.inf if i_lo < 1 else value[i_lo - 1]
    hi = math.inf if i_hi > m else value[i_hi - 1]
    return lo, hi


BandKey = tuple[int, int, int, torch.dtype]  # buffer address, size, k, dtype


def _key(x: torch.Tensor, k: int) -> BandKey:
    """Which earlier selection's threshold to start from: the same buffer (an optimizer scores
    into the same workspace memory every step; per-tensor scope selects in its slices, which
    may share a size), size, k and dtype."""
    return x.data_ptr(), x.numel(), k, x.dtype


def select(x: torch.Tensor, k: int, ws: Workspace, hint: bool = True) -> Selection | None:
    """The k-th largest of the 1-D x (1 <= k < n) and the ties it leaves out, or None if both
    bands missed (the caller then selects otherwise and may `remember` its threshold).
    hint=False: the sample's band only (the previous threshold's missed already)."""
    n = x.numel()
    key = _key(x, k)
    previous = ws.hints.get(key) if hint else None
    if previous is not None:  # the previous threshold's band, then the sample's
        found = _in_band(x, k, previous[0] - previous[1], previous[0] + previous[1], ws)
        if found is None:
            ws.hints[key] = (previous[0], previous[1] * _GROW)  # wider (`_adapt` or `remember` re-centre it)
        else:
            return _adapt(ws, key, found, n, previous[0] - previous[1], previous[0] + previous[1])
    lo, hi = _sample_band(x, k)
    found = _in_band(x, k, lo, hi, ws)
    return None if found is None else _adapt(ws, key, found, n, lo, hi)


def previous_band(key: BandKey, ws: Workspace) -> tuple[float, float] | None:
    """The band around the threshold the selection `key` found last (`select`'s first try),
    for a caller that counts the scores as it forms them (step/native.py); None if none."""
    previous = ws.hints.get(key)
    return None if previous is None else (previous[0] - previous[1], previous[0] + previous[1])


def counted(key: BandKey, ws: Workspace, band: tuple[float, float], n: int, t: float | None,
            count: int = 0) -> None:
    """What a caller of `previous_band` found: the k-th largest t with `count` entries in the
    band (the next band re-centred on t), or None: it missed (the band widens; the caller
    then stores the scores and runs `select(..., hint=False)`)."""
    lo, hi = band
    if t is None:
        centre, half = ws.hints[key]
        ws.hints[key] = (centre, half * _GROW)
        return
    _adapt(ws, key, (Selection(t, None), count), n, lo, hi)


def _in_band(x: torch.Tensor, k: int, lo: float, hi: float, ws: Workspace
             ) -> tuple[Selection, int] | None:
    """(the selection, #entries in [lo, hi]) if the k-th largest of x lies in [lo, hi]."""
    n = x.numel()
    over = torch.gt(x, hi, out=ws.get("band.over", n, x, torch.bool))
    above = int(torch.count_nonzero(over))
    if above >= k:
        return None
    padded = ws.get("band.inside", -(-n // 8) * 8, x, torch.bool)  # whole int64 words
    torch.ge(x, lo, out=padded[:n]).logical_and_(over.logical_not_())
    padded[n:] = False
    index = _positions(padded)
    return _pick(k, above, index, x.index_select(0, index))


def _pick(k: int, above: int, index: torch.Tensor, values: torch.Tensor
          ) -> tuple[Selection, int] | None:
    """The selection from #{x > hi} and the band's positions (ascending) and values, if the
    k-th largest lies in the band."""
    if above >= k or k > above + index.numel():
        return None
    rank = k - above  # of the k-th largest among the band's entries, from the top
    j = values.numel() - rank  # its place in ascending order
    if values.dtype in _NUMPY:  # numpy's introselect, ~10x torch.kthvalue's speed on a CPU
        v = values.numpy()
        t = float(np.partition(v, j)[j]) + 0.0  # -0.0 -> +0.0; a float32 or float64 exactly
        tied = v == t
        need = rank - int(np.count_nonzero(v > t))  # ties the top k keeps, >= 1
        ties = torch.from_numpy(index.numpy()[tied])  # ascending positions
    else:
        t = float(torch.kthvalue(values, j + 1).values) + 0.0
        need = rank - int(torch.count_nonzero(values > t))
        ties = index[values == t]
    return Selection(t, ties[need:] if ties.numel() > need else None), values.numel()


def _positions(mask: torch.Tensor) -> torch.Tensor:
    """mask.nonzero() for a sparse bool mask of whole int64 words: the nonzero words first
    (an eighth of the entries to scan), then their 8 entries each."""
    words = mask.view(torch.int64).nonzero().squeeze(1)
    candidates = (words[:, None] * 8 + torch.arange(8, device=mask.device)).reshape(-1)
    return candidates[mask.index_select(0, candidates)]


def _adapt(ws: Workspace, key: BandKey, found: tuple[Selection, int], n: int, lo: float,
           hi: float) -> Selection:
    """The next band: centred on t, its half-width scaled towards `_TARGET`·n entries (the
    density near t is about count / width), never narrower than twice the threshold's move."""
    sel, count = found
    t, half = float(sel.t), (hi - lo) / 2
    if not (math.isfinite(t) and math.isfinite(half)):  # an infinite t or bound: sample again
        ws.hints.pop(key, None)
        return sel
    target = max(_TARGET * n, _MIN_BAND)
    half *= min(max(target / max(count, 1), 1.0 / _GROW), _GROW)
    ws.hints[key] = (t, max(half, 2.0 * abs(t - (lo + hi) / 2)))
    return sel


def remember(x: torch.Tensor, k: int, t: torch.Tensor, ws: Workspace) -> None:
    """Centre the next band on a threshold found otherwise (after a miss: wider, as `select`
    left it; at a first call: a start width from t's magnitude)."""
    key = _key(x, k)
    value = float(t)
    if not math.isfinite(value):
        ws.hints.pop(key, None)
        return
    hint = ws.hints.get(key)
    width = max(abs(value) * 1e-3, 1e-30) if hint is None else max(hint[1], 2.0 * abs(value - hint[0]))
    ws.hints[key] = (value, width)
