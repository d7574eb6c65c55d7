"""Exact top-k selection over millions of coordinates without a full sort.

FedACT needs the exact top-⌊τD⌋ trust scores over ALL D coordinates at every local step. A full
`torch.kthvalue` over D = 5.4M costs several AdamW updates, so we first estimate the threshold
from a random sample, then find the exact k-th largest value inside a narrow band around the
estimate. The answer never depends on the sample (only the speed does): if the band misses the
k-th value we fall back to the exact full selection.
"""

from __future__ import annotations

import math

import torch

_SAMPLE = 1 << 15  # sample size for the threshold estimate
_SMALL = 1 << 17  # below this many coordinates a direct kthvalue is cheapest
_Z = 5.0  # band half-width in binomial standard deviations (miss probability ~1e-6)


def _sample_generator(device: torch.device) -> torch.Generator:
    # A fixed seed keeps runs reproducible in time as well as in value.
    return torch.Generator(device=device).manual_seed(0x5EED)


def kth_largest(x: torch.Tensor, k: int) -> torch.Tensor:
    """The k-th largest entry of the 1-D tensor `x` (1 <= k <= numel), exact."""
    n = x.numel()
    if not 1 <= k <= n:
        raise ValueError(f"k={k} must be in [1, {n}]")
    if n <= _SMALL:
        return torch.kthvalue(x, n - k + 1).values
    idx = torch.randint(n, (_SAMPLE,), device=x.device, generator=_sample_generator(x.device))
    sample = torch.sort(x[idx]).values
    q = 1.0 - k / n  # the threshold's quantile in ascending order
    half = _Z * math.sqrt(max(q * (1.0 - q), 1.0 / _SAMPLE) / _SAMPLE)
    lo = sample[max(int((q - half) * _SAMPLE), 0)]
    hi = sample[min(int(math.ceil((q + half) * _SAMPLE)), _SAMPLE - 1)]
    above = int(torch.count_nonzero(x > hi))
    band = x[(x >= lo).logical_and_(x <= hi)]
    # The k-th largest lies in [lo, hi] iff `above` < k <= above + |band|.
    if above < k <= above + band.numel():
        return torch.kthvalue(band, band.numel() - (k - above) + 1).values
    return torch.kthvalue(x, n - k + 1).values


def topk_mask(x: torch.Tensor, k: int) -> torch.Tensor:
    """Boolean mask of exactly k entries of 1-D `x`: the k largest, ties broken by lower index."""
    n = x.numel()
    if k <= 0:
        return torch.zeros(n, dtype=torch.bool, device=x.device)
    if k >= n:
        return torch.ones(n, dtype=torch.bool, device=x.device)
    threshold = kth_largest(x, k)
    mask = x >= threshold
    surplus = int(torch.count_nonzero(mask)) - k
    if surplus > 0:  # ties at the threshold: drop the highest-index tied entries
        tied = torch.nonzero(x == threshold).squeeze(1)
        mask[tied[tied.numel() - surplus:]] = False
    return mask


def topk_sum_positive(x: torch.Tensor, k: int) -> torch.Tensor:
    """Sum of max(x, 0) over the k largest entries (ties do not change the sum)."""
    if k <= 0:
        return x.new_zeros(())
    if k >= x.numel():
        return x.clamp(min=0).sum()
    threshold = kth_largest(x, k)
    strictly = x > threshold
    count = int(torch.count_nonzero(strictly))
    total = torch.where(strictly, x, 0.0).clamp_(min=0).sum()
    return total + (k - count) * threshold.clamp(min=0)
