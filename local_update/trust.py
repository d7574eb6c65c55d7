"""Coordinate trust modulation: u <- φ ⊙ u, with trust scores s = u ⊙ g (seed 000, Eq. 7-9).

- `act`: φ = α on the top ⌊τD⌋ scores, γ elsewhere (FedACT, Eq. 8). Scope `global` ranks over
  ALL coordinates of the model; `per-tensor` ranks within each tensor.
- `mgup`: the same α/γ split ranked within each tensor, as MGUP's code does (Chang & Yuan 2025).
- `cautious`: φ = 1[s > 0] rescaled by D / (nnz + 1) (Liang et al. 2024, C-AdamW's mask).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from local_update.topk import topk_mask, topk_sum_positive

TRUST_MODES = ("none", "act", "mgup", "cautious")


def act_mask(scores: torch.Tensor, tau: float, segments: Sequence[int] | None) -> torch.Tensor:
    """Top-⌊τ·D⌋ mask of the flat score vector; per segment when `segments` (sizes) is given."""
    if segments is None:
        return topk_mask(scores, math.floor(tau * scores.numel()))
    parts = [topk_mask(s, math.floor(tau * s.numel())) for s in scores.split(list(segments))]
    return torch.cat(parts)


def modulate_(u: torch.Tensor, g: torch.Tensor, mode: str, tau: float, alpha: float,
              gamma: float, tensor_sizes: Sequence[int], per_tensor: bool,
              scores: torch.Tensor | None = None) -> torch.Tensor:
    """Scale the corrected direction `u` in place by the trust coefficients φ; returns `u`.

    `tensor_sizes` split the flat vectors into the model's tensors (per-tensor scope, `mgup`).
    """
    if mode == "none":
        return u
    s = u * g if scores is None else scores
    if mode == "cautious":
        keep = s > 0
        return u.mul_(keep.to(u.dtype)).mul_(u.numel() / (int(torch.count_nonzero(keep)) + 1))
    if mode not in ("act", "mgup"):
        raise ValueError(f"unknown trust mode {mode!r}; known: {TRUST_MODES}")
    per_tensor = per_tensor or mode == "mgup"
    mask = act_mask(s, tau, tensor_sizes if per_tensor else None)
    phi = torch.where(mask, torch.tensor(alpha, dtype=u.dtype, device=u.device),
                      torch.tensor(gamma, dtype=u.dtype, device=u.device))
    return u.mul_(phi)


def pos_ratio(scores: torch.Tensor) -> float:
    """PosRatio: the share of coordinates with a positive trust score (seed 000, App. A)."""
    return int(torch.count_nonzero(scores > 0)) / max(scores.numel(), 1)


def top_mass(scores: torch.Tensor, p: float = 0.01) -> float:
    """TopMass_p: share of the positive score mass in the top ⌈p·D⌉ scores (0 if none)."""
    positive = float(scores.clamp(min=0).sum())
    if positive <= 0.0:
        return 0.0
    return float(topk_sum_positive(scores, math.ceil(p * scores.numel()))) / positive
