"""The exact top-k of each client's scores, ties to the lower index (seed 000, Eq. 8).

`top_k_mask` is the definition: a stable descending sort keeps equal scores in index order, so
its first k positions are the k largest with ties broken towards the lower index, exactly
`torch.topk`'s set as topk.py selects it. `rows_top_k_mask` finds the same set without a sort
(each row's k-th largest value by `kthvalue`, then the tied entries kept from the lowest index
up by a cumulative count), which the cohort engine runs at every local step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


def top_k_mask(scores: torch.Tensor, k: int) -> torch.Tensor:
    """bool [C, n]: the k largest entries of each row of `scores` [C, n], ties to the lower index."""
    mask = torch.zeros_like(scores, dtype=torch.bool)
    if k <= 0:
        return mask
    order = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :k]  # [C, k]
    return mask.scatter_(1, order, True)


def rows_top_k_mask(scores: torch.Tensor, k: int) -> torch.Tensor:
    """`top_k_mask` by each row's k-th largest value t: s > t, plus the first k - #(s > t)
    entries equal to t (scores without NaN, as topk.py requires)."""
    n = scores.shape[1]
    if k <= 0:
        return torch.zeros_like(scores, dtype=torch.bool)
    if k >= n:
        return torch.ones_like(scores, dtype=torch.bool)
    t = torch.kthvalue(scores, n - k + 1, dim=1, keepdim=True).values  # [C, 1] the k-th largest
    above = scores > t
    tied = scores == t
    keep = k - above.sum(dim=1, keepdim=True)  # [C, 1] tied entries still to take
    return above | (tied & (torch.cumsum(tied, dim=1) <= keep))


def segment_top_k_mask(scores: torch.Tensor, fraction: float, sizes: Sequence[int] | None,
                       fast: bool = False) -> torch.Tensor:
    """bool [C, D]: the top ⌊fraction·n⌋ of each segment of `sizes` (the model's tensors), or of
    the whole row when `sizes` is None (FedACT's global scope); `fast`: by `rows_top_k_mask`."""
    pick = rows_top_k_mask if fast else top_k_mask
    if sizes is None:
        return pick(scores, math.floor(fraction * scores.shape[1]))
    parts = [pick(s, math.floor(fraction * s.shape[1])) for s in torch.split(scores, list(sizes), dim=1)]
    return torch.cat(parts, dim=1)
