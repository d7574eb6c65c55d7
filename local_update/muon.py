"""Muon as a pure per-matrix rule (spec §2; Jordan et al. 2024, `torch.optim.Muon`).

    M = β·M + (1-β)·g                     momentum (in place)
    M̃ = (1-λ)·M^r + λ·M                   FedMIX-P (spec §4): mix before the Nesterov blend
    U = (1-β)·g + β·M̃                     Nesterov
    O = NS5(U)·sqrt(max(1, rows/cols))    orthogonalised, conv weights as [out, -1]

NS5 runs in bfloat16 by default, as `torch.optim.Muon` and the authors' code do: the
iteration only needs singular values near 1, and bf16 halves its memory traffic.
"""

from __future__ import annotations

import math

import torch

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def newton_schulz5(g: torch.Tensor, steps: int = 5, eps: float = 1e-7,
                   dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """≈ U·Vᵀ of the 2-D `g` (singular values pushed into ~[0.5, 1.5]), in `g`'s dtype."""
    if g.ndim != 2:
        raise ValueError(f"Newton-Schulz needs a matrix, got shape {tuple(g.shape)}")
    a, b, c = NS_COEFFICIENTS
    x = g.to(dtype)
    tall = g.size(0) > g.size(1)
    if tall:  # iterate on the wide side: the Gram matrix x·xᵀ is the smaller one
        x = x.T
    x = x / x.norm().clamp(min=eps)  # spectral norm ≤ Frobenius norm ≤ 1
    for _ in range(steps):
        gram = x @ x.T
        poly = torch.addmm(gram, gram, gram, beta=b, alpha=c)  # b·A + c·A²
        x = torch.addmm(x, poly, x, beta=a)  # a·X + (b·A + c·A²)·X
    return (x.T if tall else x).to(g.dtype)


def shape_scale(shape: torch.Size) -> float:
    """sqrt(max(1, rows/cols)) of the [out, -1] view: equal RMS step for tall and wide matrices."""
    rows = shape[0]
    cols = math.prod(shape[1:])
    return math.sqrt(max(1.0, rows / cols))


def muon_direction(g: torch.Tensor, momentum_buffer: torch.Tensor, beta: float,
                   reference: torch.Tensor | None = None, lam: float = 1.0) -> torch.Tensor:
    """O for this step (without the shape scale); updates `momentum_buffer` in place."""
    momentum_buffer.lerp_(g, 1.0 - beta)
    mixed = momentum_buffer if reference is None or lam == 1.0 else \
        torch.lerp(reference, momentum_buffer, lam)  # (1-λ)·M^r + λ·M
    update = g.lerp(mixed, beta)  # (1-β)·g + β·M̃
    return newton_schulz5(update.reshape(g.shape[0], -1)).reshape(g.shape)
