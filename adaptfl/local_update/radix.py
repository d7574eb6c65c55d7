"""Radix selection: the k-th largest of a float tensor, on the device, in a fixed sequence of
kernels (no sort, no host read), plus the per-block tie counts `topk` needs to write an exact
selection with ties to the lower index.

1. Canonicalise: y = x + 0.0 turns -0.0 into +0.0 (they tie, as in `torch.topk`); then the
   bit pattern orders the values: by sign, then by magnitude (reversed for negatives).
2. One pass per 16-bit digit of the pattern, most significant first: 2 passes for float32, 4
   for float64, 1 for float16/bfloat16. Each pass scatters a histogram of that digit over the
   entries whose higher digits equal the prefix found so far; the others are moved to spare
   bins by one `minimum`, so a pass counts all of y without a mask (`_digits`). A cumulative
   sum over the 65,536 bins, on the device, picks the digit that holds the k-th largest and
   counts the entries above it (`_select_bin`).
3. The histograms keep one row per block of y (`ROWS` blocks and a tail of fewer than `ROWS`
   entries), so the last pass also counts the entries tied with t in each block (`Threshold`).

Cost for float32, in passes over the D entries: two digit passes (+0.0 in the first, int
arithmetic, widening to int64, `scatter_add_`); everything else runs on 65,600 bins per block.
On CPU a digit pass goes about `_CHUNK` entries at a time, so that the values and their int64
digits stay in cache from the arithmetic to the scatter; on CUDA it is one kernel each.
"""

from __future__ import annotations

import sys
from typing import NamedTuple

import torch

from adaptfl.local_update.devices import cpu_path
from adaptfl.local_update.workspace import Workspace

ROWS = 16  # blocks of y: one histogram row each; the tie fix-up touches one block
_CPU_ROWS = 2  # CPU: digit passes go by multiples of this many rows (one per thread) ...
_CHUNK = 1 << 20  # ... of about this many entries: their int64 digits stay in cache
_BINS = 1 << 16  # one 16-bit digit per pass
_HALF = 1 << 15
_SPARE = 64  # bins for the entries outside the prefix (see `_digits`)
_INT = {2: torch.int16, 4: torch.int32, 8: torch.int64}  # same-width integer for the bit views

if sys.byteorder != "little":  # float <-> integer bit views assume the usual byte order
    raise ImportError("adaptfl.local_update.radix assumes a little-endian machine")


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
        if cpu_path(y):  # the high half-words as they lie in memory: one widening copy
            words = width // 16
            return index.copy_(y.view(torch.uint16)[..., words - 1::words])
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


def _chunk_rows(x: torch.Tensor) -> int:
    """Rows of x [rows, L] per digit pass chunk: all at once on CUDA; on CPU a multiple of
    `_CPU_ROWS` rows of about `_CHUNK` entries, so that y and its int64 digits (twice the size
    of the data) stay in cache between the arithmetic that makes them and the scatter."""
    rows, length = x.shape
    if not cpu_path(x):
        return rows
    return min(rows, max(_CPU_ROWS, _CHUNK // max(length, 1) // _CPU_ROWS * _CPU_ROWS))


def _count_rows(x: torch.Tensor, prefix: torch.Tensor | None, low: int, ws: Workspace,
                hist: torch.Tensor, in_place: bool) -> None:
    """Adds to `hist` the histogram of the digit bins of y = x + 0.0 (x [rows, L]): row r's
    into hist[r] when hist has a row per row of x, else each chunk's rows into hist[:chunk rows]
    (pooled: only the total matters). With `in_place` the first pass (prefix None) writes y
    over x and the later ones read it, otherwise y is made again in a chunk buffer by every pass.

    One `scatter_add_` of ones at the int64 digits per chunk, its rows in parallel.
    """
    rows = x.shape[0]
    step = _chunk_rows(x)
    size = step * x.shape[1]
    index = ws.get("topk.index", size, x, torch.int64)
    integer = _INT[x.element_size()]
    tmp = index if integer == torch.int64 else ws.get("topk.digits", size, x, integer)
    ones = ws.constant("topk.ones", size, x, 1, hist.dtype)
    per_row = hist.shape[0] == rows
    for r0 in range(0, rows, step):
        part = x[r0:r0 + step]
        shape, m = part.shape, part.numel()
        if not in_place:
            y = torch.add(part, 0.0, out=ws.get("topk.canonical", size, x)[:m].view(shape))
        else:
            y = part.add_(0.0) if prefix is None else part  # -0.0 -> +0.0
        d = _digits(y, prefix, low, tmp[:m].view(shape), index[:m].view(shape), ws)
        target = hist[r0:r0 + step] if per_row else hist[:shape[0]]
        target.scatter_add_(1, d, ones[:m].view(shape))


# --- the radix selection -----------------------------------------------------------------

class Threshold(NamedTuple):
    """The k-th largest t of y and, per block, how many entries equal t and how many of them
    the top k keeps (blocks: the `ROWS` rows of y's head, then the tail)."""

    t: torch.Tensor  # 0-dim, y's dtype
    tied: torch.Tensor  # [ROWS + 1]
    keep: torch.Tensor  # [ROWS + 1]


def _value_order(first: bool, negative: torch.Tensor | None, ws: Workspace,
                 like: torch.Tensor) -> torch.Tensor:
    """[65536] int64: the raw digits in ascending order of the values in their bins.

    Raw digits order the values by magnitude. The top digit holds the sign: raw 0x8000..0xFFFF
    are the negatives, largest magnitude (smallest value) last, then come the positives 0..0x7FFF.
    Below the top digit a negative prefix reverses the order.
    """
    def top(buf: torch.Tensor) -> None:  # 0xFFFF down to 0x8000, then 0 up to 0x7FFF
        torch.arange(_BINS, out=buf).sub_(_HALF)
        buf.copy_(torch.where(buf < 0, -1 - buf, buf))  # 0x7FFF..0, 0..0x7FFF
        buf[:_HALF].add_(_HALF)

    if first:
        return ws.filled("topk.order.top", _BINS, like, torch.int64, "top", top)
    assert negative is not None
    up = ws.filled("topk.order.up", _BINS, like, torch.int64, "up",
                   lambda buf: torch.arange(_BINS, out=buf))
    return torch.where(negative, _BINS - 1 - up, up)


def _select_bin(hist: torch.Tensor, k: torch.Tensor | int, first: bool,
                negative: torch.Tensor | None, ws: Workspace) -> tuple[torch.Tensor, torch.Tensor]:
    """(d, above): the raw digit whose bin holds the k-th largest, and #entries above its bin
    (hist: int32 [65536] in raw digit order; k, above: int32 [1]).

    In ascending value order, the entries at or above bin i are total - below[i], which does not
    increase with i; the answer is the last bin where it is still >= k, so counting the bins
    with below[i] <= total - k gives its position. All on the device, all int32.
    """
    order = _value_order(first, negative, ws, hist)
    counts = hist.index_select(0, order)
    upto = torch.cumsum(counts, 0, dtype=torch.int32)  # entries in bins <= i
    total = upto[-1:]
    # below[i] = upto[i-1] (0 for i = 0) does not decrease: the bins with below[i] <= total - k
    # are 0..i, and their count - 1 is the number of upto[:-1] entries <= total - k
    i = torch.searchsorted(upto[:-1], total - k, right=True)  # [1] int64 (a 0-dim index is
    return order.index_select(0, i), total - upto.index_select(0, i)  # read on the host)


def _prefix(digits: list[torch.Tensor]) -> torch.Tensor:
    """The signed integer whose 16-bit digits these are (most significant first), int64 [1]."""
    bits = torch.where(digits[0] >= _HALF, digits[0] - _BINS, digits[0])  # the sign, no overflow
    for d in digits[1:]:
        bits = bits * _BINS + d
    return bits


def threshold(x: torch.Tensor, k: int, ws: Workspace, in_place: bool) -> Threshold:
    """Radix selection of the k-th largest of x (1 <= k <= n, n >= ROWS); with `in_place`,
    x ends as x + 0.0 (-0.0 -> +0.0, equal as floats)."""
    n, w = x.numel(), x.element_size() // 2
    length = n // ROWS
    head = ROWS * length
    x2, tail = x[:head].view(ROWS, length), x[head:].view(1, n - head)
    hist = ws.get("topk.hist", (ROWS + 1) * (_BINS + _SPARE), x, torch.int32)

    rank: torch.Tensor | int = k  # rank of the k-th largest among the entries with the prefix
    digits: list[torch.Tensor] = []  # raw digits of t found so far, most significant first
    negative: torch.Tensor | None = None
    above = torch.zeros(1, dtype=torch.int32, device=x.device)  # #entries above the prefix
    for p in range(w):
        prefix = _prefix(digits) if p else None
        low = 16 * (w - p)  # bits below the prefix
        bins = _BINS if p == 0 else _BINS + _SPARE  # spare bins: patterns outside the prefix
        # the last pass keeps a row per block (the ties of each); the others only the total
        rows = ROWS + 1 if p == w - 1 else _chunk_rows(x2)
        h = hist[: rows * bins].view(rows, bins).zero_()
        _count_rows(x2, prefix, low, ws, h[:ROWS] if p == w - 1 else h, in_place)
        if head < n:
            _count_rows(tail, prefix, low, ws, h[ROWS:] if p == w - 1 else h[:1], in_place)
        total = h.sum(0, dtype=torch.int32)[:_BINS]
        digit, higher = _select_bin(total, rank, p == 0, negative, ws)
        if p == 0:
            negative = digit >= _HALF
        digits.append(digit)
        above = above + higher
        rank = rank - higher
    tied = h.index_select(1, digit).squeeze(1)  # [ROWS + 1] entries equal to t per block
    need = k - above  # ties the top k takes, 1 <= need <= tied.sum()
    before = tied.cumsum(0) - tied  # ties in earlier blocks
    keep = torch.clamp(torch.minimum(need - before, tied), min=0)
    t = _prefix(digits).to(_INT[x.element_size()]).view(x.dtype).reshape(())
    return Threshold(t, tied, keep)
