"""Exact top-k selection over millions of coordinates, on the device, without a sort or a sync.

FedACT needs the exact top-⌊τD⌋ trust scores over ALL D coordinates at every local step
(seed 000, Eq. 8). A sort or `torch.topk` costs many optimizer steps at D = 5.4M, and any
selection that reads a count back to the host (`.item()`, `nonzero`, a data-dependent branch)
stalls a GPU at every step. `radix.threshold` finds the k-th largest value t with a FIXED
sequence of kernels whose shapes depend on D and k only, and counts the entries tied with t in
each of its blocks; this module writes the selection from that:

Ties are kept from the lowest index up: blocks before the one where the kept ties run out keep
all of theirs (threshold t), blocks after keep none (threshold: the next float above t), and
the one straddling block is redone the same way in sub-blocks of `_SUB`, the last of them with
a cumulative sum (`_write_blocks`). That is one compare over the D entries on top of the
selection's two digit passes (float32).

The result is exactly `torch.topk`'s set with ties to the lower index, for every input without
NaN (inputs must not hold NaN; checking would need a sync): ±0.0 tie, ±inf, denormals (with
torch's default of no flush-to-zero), all-equal, k = 0 and k = D. Below `_SMALL` entries one
stable sort is cheaper and is used instead (exact and sync-free as well). On an accelerator
nothing reads a value on the host, so CUDA never syncs (the tests hold it on CPU by counting
host reads with the profiler on the accelerator's branches, and on CUDA under
`torch.cuda.set_sync_debug_mode("error")`). On a CPU, where a host read costs nothing, the
threshold comes from a band around the previous call's (band.py: a few compares and counts
instead of two histogram passes) and the radix selection runs only when the band misses.
"""

from __future__ import annotations

import torch

from adaptfl.local_update import band, radix
from adaptfl.local_update.devices import cpu_path
from adaptfl.local_update.workspace import Workspace, scratch

_SMALL = 1 << 14  # below this many entries one stable sort is the cheapest exact selection
_SUB = 1 << 10  # the straddling block's ties are counted in sub-blocks of this many entries
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _check(x: torch.Tensor) -> None:
    if x.dtype not in DTYPES:
        raise TypeError(f"top-k selection supports {DTYPES}, got {x.dtype}")
    if x.dim() != 1 or not x.is_contiguous():
        raise ValueError(f"top-k selection needs a contiguous 1-D tensor, got {tuple(x.shape)}")


# --- small inputs: one stable sort ----------------------------------------------------------

def _sorted_mask(x: torch.Tensor, k: int, out: torch.Tensor) -> torch.Tensor:
    """out[i] = 1 for the k largest of x, ties to the lower index (a stable sort keeps order)."""
    order = torch.sort(x, descending=True, stable=True).indices[:k]
    return out.zero_().index_fill_(0, order, 1)


# --- writing the selection ------------------------------------------------------------------

def _keep_ties(v: torch.Tensor, t: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """v > t, plus the first `keep` entries equal to t (1-D v; a cumulative sum over all of v)."""
    tied = v == t
    first = torch.cumsum(tied, dim=0, dtype=torch.int32) <= keep
    return (v > t) | (tied & first)


def _write_blocks(v: torch.Tensor, t: torch.Tensor, up: torch.Tensor, tied: torch.Tensor,
                  keep: torch.Tensor, length: int, out: torch.Tensor) -> None:
    """out = (v > t) plus, from the lowest index, keep[b] of the tied[b] entries equal to t in
    each block b of v: rows = n // length blocks of `length` entries, then the tail, shorter
    than a block (tied, keep: [rows + 1]; out may be v itself).

    One compare per block against its own threshold: t where the block keeps all its ties, the
    next float above t where it keeps none. The one block that keeps only some (or block 0, if
    none does, rewritten unchanged) is redone by `_fix_block`.
    """
    n = v.numel()
    rows = n // length
    head = rows * length
    bound = torch.where(keep == tied, t, up)
    partial = (keep > 0) & (keep < tied)
    b = torch.argmax(partial[:rows].to(torch.int32)).reshape(1)  # [1]: the block to fix
    v2, out2 = v[:head].view(rows, length), out[:head].view(rows, length)
    block = v2.index_select(0, b).squeeze(0)  # copies: read before `out` (maybe v) is written
    tail = v[head:].clone()
    torch.ge(v2, bound[:rows, None], out=out2)
    fixed = _fix_block(block, t, up, keep.index_select(0, b))
    out2.index_copy_(0, b, fixed.to(out.dtype).unsqueeze(0))
    if head < n:
        out[head:] = _keep_ties(tail, t, keep[rows:])


def _fix_block(v: torch.Tensor, t: torch.Tensor, up: torch.Tensor,
               keep: torch.Tensor) -> torch.Tensor:
    """v > t plus the first `keep` ([1]) entries equal to t, as float32 1.0 / 0.0.

    A long block goes through `_write_blocks` once more, in sub-blocks of `_SUB` whose ties are
    counted by one compare and a row sum, so that the cumulative sum runs over one sub-block
    instead of serially over the whole block.
    """
    rows = v.numel() // _SUB
    if rows < 2:
        return _keep_ties(v, t, keep).float()
    head = rows * _SUB
    # float32 1.0 / 0.0: sums up to 2^24 are exact (16-bit floats would round them)
    equal = torch.eq(v, t, out=torch.empty(v.shape, dtype=torch.float32, device=v.device))
    tied = torch.cat((equal[:head].view(rows, _SUB).sum(1), equal[head:].sum().reshape(1)))
    tied = tied.to(torch.int64)  # [rows + 1]
    before = tied.cumsum(0) - tied
    kept = torch.clamp(torch.minimum(keep - before, tied), min=0)
    _write_blocks(v, t, up, tied, kept, _SUB, equal)
    return equal


def _write_top(x: torch.Tensor, k: int, ws: Workspace, out: torch.Tensor) -> torch.Tensor:
    """out = 1 on the top k of x, 0 elsewhere; out may be x itself.

    Float comparisons: -0.0 == +0.0 as the selection requires, with no +0.0 pass.
    """
    if cpu_path(x):  # a band around the last threshold, counted on the host (band.py)
        sel = band.select(x, k, ws)
        if sel is not None:
            torch.ge(x, sel.t, out=out)
            return out if sel.drop is None else out.index_fill_(0, sel.drop, 0)
    th = radix.threshold(x, k, ws, in_place=out is x)
    if cpu_path(x):
        band.remember(x, k, th.t, ws)
    t = th.t
    up = torch.nextafter(t, t.new_full((), float("inf")))
    up = torch.where(up > t, up, float("nan"))  # above +inf: nothing (x >= nan is False)
    _write_blocks(x, t, up, th.tied, th.keep, x.numel() // radix.ROWS, out)  # n // L = ROWS
    return out


# --- the public API ---------------------------------------------------------------------

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
    if cpu_path(x) and k < n:
        sel = band.select(x, k, ws)
        if sel is not None:
            return torch.tensor(sel.t, dtype=x.dtype)
    t = radix.threshold(x, k, ws, in_place=False).t
    if cpu_path(x) and k < n:
        band.remember(x, k, t, ws)
    return t


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
    return _write_top(x, k, scratch(ws), out)


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
    return _write_top(x, k, scratch(ws), x)


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
