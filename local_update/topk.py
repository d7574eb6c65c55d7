"""Exact top-k selection over millions of coordinates, on the device, without a sort or a sync.

FedACT needs the exact top-⌊τD⌋ trust scores over ALL D coordinates at every local step
(seed 000, Eq. 8). A sort or `torch.topk` costs many optimizer steps at D = 5.4M, and any
selection that reads a count back to the host (`.item()`, `nonzero`, a data-dependent branch)
stalls a GPU at every step. This module finds the k-th largest value t by a radix selection on
the floats' bit patterns, with a FIXED sequence of kernels whose shapes depend on D and k only:

1. Canonicalise: y = x + 0.0 turns -0.0 into +0.0 (they tie, as in `torch.topk`); then the
   bit pattern orders the values: by sign, then by magnitude (reversed for negatives).
2. One pass per 16-bit digit of the pattern, most significant first: 2 passes for float32, 4
   for float64, 1 for float16/bfloat16. Each pass scatters a histogram of that digit over the
   entries whose higher digits equal the prefix found so far; the others are moved to spare
   bins by one `minimum`, so a pass counts all of y without a mask (`_digits`). A cumulative
   sum over the 65,536 bins, on the device, picks the digit that holds the k-th largest and
   counts the entries above it (`_select_bin`).
3. The histograms keep one row per block of y (`_ROWS` blocks and a tail of fewer than
   `_ROWS` entries), so the last pass also counts the entries tied with t in each block.
   Ties are kept from the lowest index up: blocks before the one where the kept ties run out
   keep all of theirs (threshold t), blocks after keep none (threshold: the next float above
   t), and the one straddling block is fixed with a cumulative sum over it.

The result is exactly `torch.topk`'s set with ties to the lower index, for every input without
NaN (inputs must not hold NaN; checking would need a sync): ±0.0 tie, ±inf, denormals (with
torch's default of no flush-to-zero), all-equal, k = 0 and k = D. Passes over the D entries
for float32: +0.0 fused with the first digit pass, the two digit passes (int arithmetic,
widening to int64, `scatter_add_`), the final compare; the rest runs on 65,600 bins per block
or on one block. On CPU the digit passes go two blocks at a time, so that the int64 digits
stay in cache. Below `_SMALL` entries one stable sort is cheaper and is used instead (exact
and sync-free as well). Nothing reads a value on the host, so the same code runs on CUDA
without a sync (`torch.cuda.set_sync_debug_mode("error")` holds in the tests).
"""

from __future__ import annotations

import sys
from typing import NamedTuple

import torch
from adaptfl.local_update.workspace import Workspace, scratch

_SMALL = 1 << 14  # below this many entries one stable sort is the cheapest exact selection
_ROWS = 16  # blocks of y: one histogram row each; the tie fix-up touches one block
_CPU_ROWS = 2  # CPU: rows whose digits are made and counted at a time (one per thread)
_BINS = 1 << 16  # one 16-bit digit per pass
_HALF = 1 << 15
_SPARE = 64  # bins for the entries outside the prefix (see `_digits`)
_INT = {2: torch.int16, 4: torch.int32, 8: torch.int64}  # same-width integer for the bit views
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

if sys.byteorder != "little":  # float <-> integer bit views assume the usual byte order
    raise ImportError("adaptfl.local_update.topk assumes a little-endian machine")


def _check(x: torch.Tensor) -> None:
    if x.dtype not in DTYPES:
        raise TypeError(f"top-k selection supports {DTYPES}, got {x.dtype}")
    if x.dim() != 1 or not x.is_contiguous():
        raise ValueError(f"top-k selection needs a contiguous 1-D tensor, got {tuple(x.shape)}")


# --- one digit pass -----------------------------------------------------------------------

def _digits(y: torch.Tensor, prefix: torch.Tensor | None, low: int, tmp: torch.Tensor,
            index: torch.Tensor, ws: Workspace) -> torch.Tensor:
    """index = the histogram bin of every entry of y for the next 16-bit digit (int64, y's
    shape; tmp: an integer scratch of y's width, or index itself for 64-bit floats).

    prefix None (first pass): the top digit, 0..65535. Otherwise the digit below `prefix` (the
    top bits found so far, `low` bits below it), and 65,536 + (position mod 64) for every
    pattern outside the prefix. z = bits ^ (prefix << low) lies in [0, 2^low) exactly for the
    patterns with the prefix, i.e. z < 2^low as an unsigned number; flipping the sign bit turns
    that unsigned order into the signed one, so a single `minimum` with a fixed bound moves all
    other patterns out of the way. The bound cycles over 64 spare bins: a scatter into one or
    two hot bins, between a few entries spread at random over the histogram, serialises on
    the same counter; 64 independent ones do not. Only xor and min: nothing can overflow.
    """
    bits = y.view(_INT[y.element_size()])
    width = 8 * y.element_size()
    if width == 16:  # 16-bit floats: one pass, the whole pattern read as an unsigned number
        return index.copy_(bits).bitwise_and_(_BINS - 1)
    if prefix is None:  # the top 16 bits, read as an unsigned number
        top = torch.bitwise_right_shift(bits, width - 16, out=tmp).bitwise_and_(_BINS - 1)
        return top if top is index else index.copy_(top)
    sign = -(1 << (width - 1))
    flip = ((prefix * (1 << low)) ^ sign).reshape(()).to(bits.dtype)  # 0-dim: no promotion

    def spare_bins(buf: torch.Tensor) -> None:  # sign + 2^low + (i mod 64) << (low - 16)
        torch.arange(buf.numel(), out=buf).bitwise_and_(_SPARE - 1)
        buf.bitwise_left_shift_(low - 16).add_(sign + (1 << low))

    bound = ws.filled("topk.bound", y.numel(), y, bits.dtype, (bits.dtype, low), spare_bins)
    z = torch.bitwise_xor(bits, flip, out=tmp)
    torch.minimum(z, bound.view(z.shape), out=z).bitwise_xor_(sign)
    if low > 16:
        z.bitwise_right_shift_(low - 16)
    return z if z is index else index.copy_(z)


def _count_rows(x: torch.Tensor, y: torch.Tensor, prefix: torch.Tensor | None, low: int,
                ws: Workspace, hist: torch.Tensor) -> None:
    """hist[r] = histogram of the digit bins of y[r] (y [rows, L], hist [rows, bins]).

    One `scatter_add_` of ones at the int64 digits, the rows in parallel. On CPU two rows at a
    time (one per thread), so that the digits (twice the size of the data) stay in cache
    between the arithmetic that makes them and the scatter that reads them. The first pass
    (prefix None) also writes y = x + 0.0 (-0.0 -> +0.0) while x's rows are in cache.
    """
    rows, length = y.shape
    step = _CPU_ROWS if y.device.type == "cpu" else rows
    size = min(step, rows) * length
    index = ws.get("topk.index", size, y, torch.int64)
    integer = _INT[y.element_size()]
    tmp = index if integer == torch.int64 else ws.get("topk.digits", size, y, integer)
    ones = ws.constant("topk.ones", size, y, 1, hist.dtype)
    hist.zero_()
    for r0 in range(0, rows, step):
        part = y[r0:r0 + step]
        if prefix is None:
            torch.add(x[r0:r0 + step], 0.0, out=part)
        m = part.numel()
        d = _digits(part, prefix, low, tmp[:m].view(part.shape), index[:m].view(part.shape), ws)
        hist[r0:r0 + step].scatter_add_(1, d, ones[:m].view(part.shape))


# --- the radix selection -----------------------------------------------------------------

class _Threshold(NamedTuple):
    """The k-th largest t of y and, per block, how many entries equal t and how many of them
    the top k keeps (blocks: the `_ROWS` rows of y's head, then the tail)."""

    t: torch.Tensor  # 0-dim, y's dtype
    tied: torch.Tensor  # [_ROWS + 1]
    keep: torch.Tensor  # [_ROWS + 1]


def _at_least(hist: torch.Tensor, first: bool, negative: torch.Tensor | None) -> torch.Tensor:
    """[65536] for each raw digit: how many entries have a value >= the values in its bin.

    Raw digits order the values by magnitude. The top digit holds the sign: raw 0..0x7FFF are
    the positives (smallest first), 0x8000..0xFFFF the negatives (smallest magnitude, i.e.
    largest value, first). Below the top digit, a negative prefix reverses the order.
    """
    c = hist.cumsum(0)  # entries in raw bins <= d
    if first:
        positive = c[_HALF - 1:_HALF]  # [1] all positive entries
        return torch.cat((positive - c[:_HALF] + hist[:_HALF], c[_HALF:]))
    assert negative is not None
    return torch.where(negative, c, c[-1:] - c + hist)


def _digit_of_rank(r: torch.Tensor, first: bool, negative: torch.Tensor | None) -> torch.Tensor:
    """The raw digit at position r of ascending value order (the order `_at_least` assumes)."""
    if first:  # negatives (raw 0xFFFF down to 0x8000), then positives (raw 0 up to 0x7FFF)
        return torch.where(r >= _HALF, r - _HALF, _BINS - 1 - r)
    assert negative is not None
    return torch.where(negative, _BINS - 1 - r, r)


def _select_bin(hist: torch.Tensor, k: torch.Tensor | int, first: bool,
                negative: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(d, above): the raw digit whose bin holds the k-th largest, and #entries above its bin.

    In value order `_at_least` does not increase, so the bins with at least k entries at or
    above them are the lowest-valued ones up to the answer: counting them gives its rank.
    """
    at_least = _at_least(hist, first, negative)
    rank = torch.ge(at_least, k).sum().reshape(1) - 1  # [1]: a 0-dim index is read on host
    d = _digit_of_rank(rank, first, negative)
    return d, at_least.index_select(0, d) - hist.index_select(0, d)


def _prefix(digits: list[torch.Tensor]) -> torch.Tensor:
    """The signed integer whose 16-bit digits these are (most significant first), int64 [1]."""
    bits = torch.where(digits[0] >= _HALF, digits[0] - _BINS, digits[0])  # the sign, no overflow
    for d in digits[1:]:
        bits = bits * _BINS + d
    return bits


def _threshold(x: torch.Tensor, k: int, ws: Workspace, y: torch.Tensor) -> _Threshold:
    """Radix selection of the k-th largest of x (1 <= k <= n, n >= _ROWS); writes y = x + 0.0
    (y may be x itself)."""
    n, w = x.numel(), x.element_size() // 2
    length = n // _ROWS
    head = _ROWS * length
    x2, tail_x = x[:head].view(_ROWS, length), x[head:].view(1, n - head)
    y2, tail_y = y[:head].view(_ROWS, length), y[head:].view(1, n - head)
    hist = ws.get("topk.hist", (_ROWS + 1) * (_BINS + _SPARE), x, torch.int32)

    rank: torch.Tensor | int = k  # rank of the k-th largest among the entries with the prefix
    digits: list[torch.Tensor] = []  # raw digits of t found so far, most significant first
    negative: torch.Tensor | None = None
    above = torch.zeros(1, dtype=torch.int64, device=x.device)  # #entries above the prefix
    for p in range(w):
        prefix = _prefix(digits) if p else None
        low = 16 * (w - p)  # bits below the prefix
        bins = _BINS if p == 0 else _BINS + _SPARE  # spare bins: patterns outside the prefix
        h = hist[: (_ROWS + 1) * bins].view(_ROWS + 1, bins)
        _count_rows(x2, y2, prefix, low, ws, h[:_ROWS])
        _count_rows(tail_x, tail_y, prefix, low, ws, h[_ROWS:])
        total = h.sum(0, dtype=torch.int32)[:_BINS]
        digit, higher = _select_bin(total, rank, p == 0, negative)
        if p == 0:
            negative = digit >= _HALF
        digits.append(digit)
        above = above + higher
        rank = rank - higher
    tied = h.index_select(1, digit).squeeze(1)  # [_ROWS + 1] entries equal to t per block
    need = k - above  # ties the top k takes, 1 <= need <= tied.sum()
    before = tied.cumsum(0) - tied  # ties in earlier blocks
    keep = torch.clamp(torch.minimum(need - before, tied), min=0)
    t = _prefix(digits).to(_INT[x.element_size()]).view(x.dtype).reshape(())
    return _Threshold(t, tied, keep)


# --- small inputs: one stable sort ----------------------------------------------------------

def _sorted_mask(x: torch.Tensor, k: int, out: torch.Tensor) -> torch.Tensor:
    """out[i] = 1 for the k largest of x, ties to the lower index (a stable sort keeps order)."""
    order = torch.sort(x, descending=True, stable=True).indices[:k]
    return out.zero_().index_fill_(0, order, 1)


# --- writing the selection ------------------------------------------------------------------

def _keep_ties(v: torch.Tensor, t: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """v > t, plus the first `keep` entries equal to t (along the last dim)."""
    tied = v == t
    first = torch.cumsum(tied, dim=-1, dtype=torch.int32) <= keep
    return (v > t) | (tied & first)


def _write_top(x: torch.Tensor, k: int, ws: Workspace, y: torch.Tensor,
               out: torch.Tensor) -> torch.Tensor:
    """out = 1 on the top k of x, 0 elsewhere, via y = x + 0.0; y and out may be x itself."""
    th = _threshold(x, k, ws, y)
    t = th.t
    up = torch.nextafter(t, t.new_full((), float("inf")))
    up = torch.where(up > t, up, float("nan"))  # above +inf: nothing (x >= nan is False)
    bound = torch.where(th.keep == th.tied, t, up)  # >= t keeps a block's ties, >= up none
    n = y.numel()
    length = n // _ROWS
    head = _ROWS * length
    y2, out2 = y[:head].view(_ROWS, length), out[:head].view(_ROWS, length)
    partial = (th.keep > 0) & (th.keep < th.tied)
    row = torch.argmax(partial[:_ROWS].to(torch.int32)).reshape(1)  # the block (or 0) to fix
    block = y2.index_select(0, row)  # [1, L], read before `out` (maybe y) is written
    tail = y[head:].clone()
    torch.ge(y2, bound[:_ROWS, None], out=out2)
    keep_row = th.keep.index_select(0, row)  # [1]
    out2.index_copy_(0, row, _keep_ties(block, t, keep_row).to(out.dtype))
    out[head:] = _keep_ties(tail, t, th.keep[_ROWS:])
    return out


# --- the public API ---------------------------------------------------------------------

def _canonical_buffer(x: torch.Tensor, ws: Workspace) -> torch.Tensor:
    """Where y = x + 0.0 goes when x must stay as it is."""
    return ws.get("topk.canonical", x.numel(), x)


def kth_largest(x: torch.Tensor, k: int, ws: Workspace | None = None) -> torch.Tensor:
    """The k-th largest entry of the 1-D tensor `x` (1 <= k <= numel), exact, as a 0-dim
    tensor on x's device (+0.0 where the k-th largest is a zero of either sign)."""
    _check(x)
    n = x.numel()
    if not 1 <= k <= n:
        raise ValueError(f"k={k} must be in [1, {n}]")
    if n < _SMALL:
        return torch.sort(x, descending=True).values[k - 1] + 0.0
    ws = scratch(ws)
    return _threshold(x, k, ws, _canonical_buffer(x, ws)).t


def topk_mask(x: torch.Tensor, k: int, ws: Workspace | None = None) -> torch.Tensor:
    """Boolean mask of exactly k entries of 1-D `x`: the k largest, ties broken by lower index."""
    _check(x)
    n = x.numel()
    out = torch.zeros(n, dtype=torch.bool, device=x.device)
    if k <= 0:
        return out
    if k >= n:
        return out.fill_(True)
    if n < _SMALL:
        return _sorted_mask(x, k, out)
    ws = scratch(ws)
    return _write_top(x, k, ws, _canonical_buffer(x, ws), out)


def topk_indicator_(x: torch.Tensor, k: int, ws: Workspace | None = None) -> torch.Tensor:
    """`topk_mask` as 1.0 / 0.0 written over `x` itself (saves a D-sized buffer and a pass)."""
    _check(x)
    n = x.numel()
    if k <= 0:
        return x.zero_()
    if k >= n:
        return x.fill_(1.0)
    if n < _SMALL:
        return x.copy_(_sorted_mask(x, k, torch.empty_like(x)))
    return _write_top(x, k, scratch(ws), x, x)


def topk_sum_positive(x: torch.Tensor, k: int, ws: Workspace | None = None) -> torch.Tensor:
    """Sum of max(x, 0) over the k largest entries (ties do not change the sum), 0-dim.

    With t the k-th largest and t⁺ = max(t, 0), the top k hold every entry above t and
    (k - #above) copies of t, so their positive sum is Σ max(x - t⁺, 0) + k·t⁺ (if t < 0 this
    is the whole positive mass): one selection and one fused pass, no mask.
    """
    if k <= 0:
        return x.new_zeros(())
    if k >= x.numel():
        return x.clamp(min=0).sum()
    t = kth_largest(x, k, ws).clamp(min=0)
    over = torch.sub(x, t, out=scratch(ws).get("topk.over", x.numel(), x)).clamp_(min=0)
    return over.sum() + k * t
