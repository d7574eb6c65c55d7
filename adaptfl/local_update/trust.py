"""Coordinate trust modulation: u <- φ ⊙ u, with trust scores s = u ⊙ g (seed 000, Eq. 7-9).

- `act`: φ = α on the top ⌊τD⌋ scores, γ elsewhere (FedACT, Eq. 8). Scope `global` ranks over
  ALL coordinates of the model; `per-tensor` ranks within each tensor.
- `mgup`: the same α/γ split ranked within each tensor, as MGUP's code does (Chang & Yuan 2025).
- `cautious`: φ = 1[s > 0] rescaled by D / (nnz + 1) (Liang et al. 2024, C-AdamW's mask).

Nothing here reads a value back to the host: the top-k is the radix selection of `topk.py` (a
fixed kernel sequence), the cautious rescaling multiplies by a 0-dim device tensor, and the
diagnostics return 0-dim float64 tensors on the scores' device, for the caller to accumulate
and read once per round. A step therefore never waits for the GPU.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from adaptfl.local_update.topk import topk_indicator_, topk_sum_positive
from adaptfl.local_update.workspace import Workspace, scratch

TRUST_MODES = ("none", "act", "mgup", "cautious")


def act_phi_(scores: torch.Tensor, tau: float, alpha: float, gamma: float,
             segments: Sequence[int] | None, ws: Workspace | None = None,
             scale: float = 1.0) -> torch.Tensor:
    """scale·φ of `act` written over `scores`: α on the top ⌊τ·D⌋ (per segment if given), γ
    elsewhere, both times `scale` (the step folds -lr in here)."""
    parts = [scores] if segments is None else torch.split(scores, list(segments))
    for s in parts:
        topk_indicator_(s, math.floor(tau * s.numel()), ws)
    # 1·αc = αc and 0·αc clamped at γc is γc exactly (α ≥ γ ≥ 0; c < 0 flips the clamp), in
    # two vectorised passes; torch.where with scalars is an unvectorised loop on CPU.
    scores.mul_(alpha * scale)
    return scores.clamp_(min=gamma * scale) if scale > 0 else scores.clamp_(max=gamma * scale)


def phi_(scores: torch.Tensor, mode: str, tau: float, alpha: float, gamma: float,
         tensor_sizes: Sequence[int], per_tensor: bool, ws: Workspace | None = None,
         scale: float = 1.0) -> torch.Tensor:
    """scale·φ, the trust coefficients of `mode` from s = u ⊙ g, written over `scores`.

    `tensor_sizes` split the flat vector into the model's tensors (per-tensor scope, `mgup`).
    """
    if mode == "cautious":
        # count on a bool mask: count_nonzero over floats is an order of magnitude slower
        keep = torch.gt(scores, 0, out=scratch(ws).get("trust.mask", scores.numel(), scores, torch.bool))
        # scale·D / (nnz + 1) in float64, as the Python float it replaces (one rounding to s's dtype)
        denominator = torch.count_nonzero(keep).add_(1).double()
        factor = torch.full_like(denominator, scores.numel() * scale).div_(denominator).to(scores.dtype)
        return torch.gt(scores, 0, out=scores).mul_(factor)  # s -> 1.0 / 0.0 -> φ
    if mode not in ("act", "mgup"):
        raise ValueError(f"unknown trust mode {mode!r}; known: {TRUST_MODES}")
    per_tensor = per_tensor or mode == "mgup"
    return act_phi_(scores, tau, alpha, gamma, tensor_sizes if per_tensor else None, ws, scale)


def modulate_(u: torch.Tensor, g: torch.Tensor, mode: str, tau: float, alpha: float,
              gamma: float, tensor_sizes: Sequence[int], per_tensor: bool,
              scores: torch.Tensor | None = None, ws: Workspace | None = None) -> torch.Tensor:
    """Scale the corrected direction `u` in place by the trust coefficients φ; returns `u`.

    `scores` (s = u ⊙ g, if the caller has it) is used as scratch and overwritten.
    """
    if mode == "none":
        return u
    s = u * g if scores is None else scores
    return u.mul_(phi_(s, mode, tau, alpha, gamma, tensor_sizes, per_tensor, ws))


def pos_ratio(scores: torch.Tensor, ws: Workspace | None = None) -> torch.Tensor:
    """PosRatio: the share of coordinates with a positive trust score (seed 000, App. A).

    A 0-dim float64 tensor on the scores' device (exactly #positive / D, as a Python float).
    """
    n = scores.numel()
    positive = torch.gt(scores, 0, out=scratch(ws).get("trust.mask", n, scores, torch.bool))
    return torch.count_nonzero(positive).double() / max(n, 1)


def top_mass(scores: torch.Tensor, p: float = 0.01, ws: Workspace | None = None) -> torch.Tensor:
    """TopMass_p: share of the positive score mass in the top ⌈p·D⌉ scores (0 if none).

    A 0-dim float64 tensor on the scores' device: a partial sort on a CPU, one radix selection
    of the ⌈p·D⌉-th score (no host read) on a GPU.
    """
    n = scores.numel()
    if n == 0:
        return scores.new_zeros((), dtype=torch.float64)
    positive = torch.clamp(scores, min=0, out=scratch(ws).get("trust.tmp", n, scores)).sum()
    k = math.ceil(p * n)
    if scores.device.type == "cpu":  # a partial sort: 2.3x the radix threshold's speed on a CPU
        top = torch.topk(scores, k, sorted=False).values.clamp(min=0).sum()  # (50,890 scores)
    else:  # no host read on a GPU
        top = topk_sum_positive(scores, k, ws)
    share = top.double() / positive.double()  # nan where positive == 0, replaced below
    return torch.where(positive > 0, share, 0.0)


def rows_diagnostics(scores: torch.Tensor, p: float = 0.01) -> dict[str, torch.Tensor]:
    """PosRatio and TopMass_p of each row of `scores` [C, D] (C clients' s = u ⊙ g at once, the
    cohort engine's): float64 [C] each, the same quantities as `pos_ratio` and `top_mass`."""
    n = scores.shape[1]
    positive = scores.clamp(min=0).double().sum(dim=1)
    k = min(n, math.ceil(p * n))
    top = torch.topk(scores, k, dim=1, sorted=False).values.clamp(min=0).double().sum(dim=1)
    share = torch.where(positive > 0, top / positive.clamp(min=torch.finfo(torch.float64).tiny), 0.0)
    return {"pos-ratio": (scores > 0).sum(dim=1).double() / max(n, 1),
            "top-mass": share if n else torch.zeros_like(positive)}
