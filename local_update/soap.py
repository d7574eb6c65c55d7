"""SOAP as a pure per-tensor rule (spec §2; Vyas et al. 2024): Adam in Shampoo's eigenbasis.

State of one tensor with modes d_0 … d_{n-1} (a conv weight has 4):
    gg[i]  [d_i, d_i]   Kronecker statistic of mode i (None where d_i > max_precond_dim, or 1-D)
    Q[i]   [d_i, d_i]   its eigenbasis, descending eigenvalues (None: mode left unrotated)
    exp_avg             first moment, kept in the ORIGINAL basis and rotated on use (equivalent
                        to rotating it at every basis change, as the authors' code does)
    exp_avg_sq          second moment in the ROTATED basis

One step (k = Adam step from 1):
    m = lerp(m, g, 1-β1);  v = lerp(v, (Qᵀg)², 1-β2);  d = Q·(Qᵀm / (sqrt(v)+ε))
    step size lr·sqrt(1-β2^k)/(1-β1^k) (ε before the bias correction); then, AFTER the step,
    gg[i] = lerp(gg[i], g ×_{≠i} g, 1-shampoo_β) and every f steps Q <- QR(gg̃·Q), v re-sorted.

FedMIX-P (spec §4) derives Q from gg̃ = (1-λ)·gg^r + λ·gg (the caller passes `mix`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import chain

import torch

Factors = list[torch.Tensor | None]
Mix = Callable[[int, torch.Tensor], torch.Tensor]  # (mode, own gg) -> the gg the basis uses


def new_factors(shape: Sequence[int], max_precond_dim: int, like: torch.Tensor) -> Factors:
    """Zero statistics per mode; 1-D tensors and modes above max_precond_dim get none."""
    if len(shape) < 2:
        return [None]
    return [like.new_zeros(d, d) if d <= max_precond_dim else None for d in shape]


def project(x: torch.Tensor, basis: Sequence[torch.Tensor | None], back: bool = False) -> torch.Tensor:
    """Qᵀx (or Q·x with back=True) mode by mode; each contraction moves its mode to the end."""
    for q in basis:
        if q is None:
            x = x.permute(*range(1, x.ndim), 0)
        else:
            x = torch.tensordot(x, q, dims=([0], [1 if back else 0]))
    return x


def update_factors_(factors: Factors, g: torch.Tensor, shampoo_beta: float) -> None:
    """gg[i] = shampoo_β·gg[i] + (1-shampoo_β)·(g contracted with g over every mode but i)."""
    for i, gg in enumerate(factors):
        if gg is not None:
            others = [*chain(range(i), range(i + 1, g.ndim))]
            gg.lerp_(torch.tensordot(g, g, dims=(others, others)), 1.0 - shampoo_beta)


def eigenbasis(factors: Sequence[torch.Tensor | None]) -> list[torch.Tensor | None]:
    """Eigenvectors of each statistic, descending eigenvalues (a full `eigh`, used once)."""
    out: list[torch.Tensor | None] = []
    for gg in factors:
        if gg is None:
            out.append(None)
            continue
        eye = torch.eye(gg.shape[0], dtype=gg.dtype, device=gg.device)
        out.append(torch.linalg.eigh(gg + 1e-30 * eye)[1].flip(1))
    return out


def refresh_basis(factors: Sequence[torch.Tensor | None], basis: Sequence[torch.Tensor | None],
                  exp_avg_sq: torch.Tensor) -> tuple[list[torch.Tensor | None], torch.Tensor]:
    """One power iteration + QR per mode; v re-sorted along the mode to the new eigenvalue order."""
    out: list[torch.Tensor | None] = []
    for i, (gg, q) in enumerate(zip(factors, basis, strict=True)):
        if gg is None or q is None:
            out.append(None)
            continue
        power = gg @ q
        order = torch.argsort((q * power).sum(0), descending=True)  # Rayleigh quotients
        exp_avg_sq = exp_avg_sq.index_select(i, order)
        out.append(torch.linalg.qr(power.index_select(1, order).float())[0].to(q.dtype))
    return out, exp_avg_sq


def soap_direction(g: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
                   basis: Sequence[torch.Tensor | None], beta1: float, beta2: float,
                   eps: float) -> torch.Tensor:
    """Q·(Qᵀm / (sqrt(v)+ε)) before the step size; updates m and v in place."""
    exp_avg.lerp_(g, 1.0 - beta1)
    exp_avg_sq.lerp_(project(g, basis).square(), 1.0 - beta2)
    return project(project(exp_avg, basis) / exp_avg_sq.sqrt().add_(eps), basis, back=True)


def mixed_factors(factors: Factors, mix: Mix | None) -> Factors:
    if mix is None:
        return factors
    return [None if gg is None else mix(i, gg) for i, gg in enumerate(factors)]
