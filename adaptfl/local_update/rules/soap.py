"""SOAP as a pure per-tensor rule (Vyas et al. 2024): Adam in Shampoo's eigenbasis.

State of one tensor with modes d_0 … d_{n-1} (a conv weight has 4):
    gg<i>  [d_i, d_i]   Kronecker statistic of mode i (absent where d_i > max_precond_dim, or 1-D)
    Q<i>   [d_i, d_i]   its eigenbasis, descending eigenvalues (absent: mode left unrotated)
    exp_avg             first moment, kept in the ORIGINAL basis and rotated on use (equivalent
                        to rotating it at every basis change, as the authors' code does)
    exp_avg_sq          second moment in the ROTATED basis

One step (n = Adam step from 1):
    m = lerp(m, g, 1-β1);  v = lerp(v, (Qᵀg)², 1-β2);  d = Q·(Qᵀm / (sqrt(v)+ε))
    step size lr·sqrt(1-β2^n)/(1-β1^n) (ε before the bias correction); then, AFTER the step,
    gg<i> = lerp(gg<i>, g ×_{≠i} g, 1-shampoo_β) and every f steps Q <- QR(gg̃·Q), v re-sorted.
A fresh tensor's first step only initialises gg and Q (no move); a warm-started one (FedPAC's
alignment) derives Q from the received statistics and takes a full step at once.
FedMIX-P (seed 002) derives Q from gg̃ = (1-λ)·gg^r + λ·gg.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

import torch

from adaptfl.core.domain import PSD, Domain
from adaptfl.core.params import component, param
from adaptfl.local_update.rules import Direction, Preconditioner, Shape, Step

Factors = list[torch.Tensor | None]


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


def eigenbasis(factors: Sequence[torch.Tensor | None]) -> Factors:
    """Eigenvectors of each statistic, descending eigenvalues (a full `eigh`, used once)."""
    out: Factors = []
    for gg in factors:
        if gg is None:
            out.append(None)
            continue
        eye = torch.eye(gg.shape[0], dtype=gg.dtype, device=gg.device)
        out.append(torch.linalg.eigh(gg + 1e-30 * eye)[1].flip(1))
    return out


def refresh_basis(factors: Sequence[torch.Tensor | None], basis: Sequence[torch.Tensor | None],
                  exp_avg_sq: torch.Tensor) -> tuple[Factors, torch.Tensor]:
    """One power iteration + QR per mode; v re-sorted along the mode to the new eigenvalue order."""
    out: Factors = []
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


@component("preconditioner", "soap")
@dataclass(frozen=True)
class SOAP(Preconditioner):
    """SOAP: Adam in the eigenbasis of Shampoo's per-mode statistics."""

    soap_beta1: float = param(0.95, "SOAP's β1", within=(0.0, 1.0), open_high=True)
    soap_beta2: float = param(0.95, "SOAP's β2", within=(0.0, 1.0), open_high=True)
    shampoo_beta: float = param(0.95, "EMA weight of SOAP's Kronecker statistics",
                                within=(0.0, 1.0), open_high=True)
    precondition_frequency: int = param(10, "SOAP's f: power iteration + QR every f steps", within=(1, None))
    max_precond_dim: int = param(10000, "SOAP modes larger than this stay unrotated", within=(1, None))
    eps: float = param(1e-8, "ε added to sqrt(v̂)", within=(0.0, None), open_low=True)

    torch_names = {"betas": ("soap_beta1", "soap_beta2")}  # the authors' SOAP's
    default_lr = 3e-3
    default_weight_decay = 0.01
    elementwise = False
    decay_after = True
    slots = ("exp_avg", "exp_avg_sq")
    shareable = True

    def modes(self, shape: Shape) -> list[int]:
        """The modes that get a statistic (and a basis): ≥2-D tensors, ≤ max_precond_dim."""
        return [i for i, d in enumerate(shape) if d <= self.max_precond_dim] if len(shape) >= 2 else []

    def init(self, p: torch.Tensor) -> dict[str, Any]:
        return {f"gg{i}": p.new_zeros(p.shape[i], p.shape[i]) for i in self.modes(tuple(p.shape))} | \
            {"adam_step": 0}

    def theta_shapes(self, name: str, shape: Shape) -> dict[str, Shape]:
        return {f"gg{i}": (shape[i], shape[i]) for i in self.modes(shape)}

    def theta_domain(self, slot: str) -> Domain:
        return PSD  # L, R = EMAs of G·Gᵀ: their eigenbasis is SOAP's rotation

    def direction(self, g: torch.Tensor, st: dict[str, Any], step: Step) -> Direction:
        n = g.ndim
        factors: Factors = [st.get(f"gg{i}") for i in range(n)] if n >= 2 else [None]
        if "Q_ready" not in st:
            if not st.get("warm"):  # fresh: the first step only initialises gg and Q
                update_factors_(factors, g, self.shampoo_beta)
                self._set_basis(st, eigenbasis(factors))
                return Direction(None)
            self._set_basis(st, eigenbasis(self._mixed(st, factors, step.lam)))  # warm: full step
        basis = [st.get(f"Q{i}") for i in range(len(factors))]
        st["adam_step"] += 1
        k = st["adam_step"]
        d = soap_direction(g, st["exp_avg"], st["exp_avg_sq"], basis, self.soap_beta1,
                           self.soap_beta2, self.eps)
        size = math.sqrt(1.0 - self.soap_beta2**k) / (1.0 - self.soap_beta1**k)
        update_factors_(factors, g, self.shampoo_beta)  # AFTER use (used only from the next basis)
        if k % self.precondition_frequency == 0:
            new_basis, st["exp_avg_sq"] = refresh_basis(self._mixed(st, factors, step.lam), basis,
                                                        st["exp_avg_sq"])
            self._set_basis(st, new_basis)
        return Direction(d, size)

    @staticmethod
    def _set_basis(st: dict[str, Any], basis: Factors) -> None:
        for i, q in enumerate(basis):
            if q is not None:
                st[f"Q{i}"] = q
        st["Q_ready"] = True

    @staticmethod
    def _mixed(st: dict[str, Any], factors: Factors, lam: float) -> Factors:
        """(1-λ)·gg^r + λ·gg where the reference has the mode (FedMIX-P); own gg otherwise."""
        if lam == 1.0:
            return factors
        out: Factors = []
        for i, gg in enumerate(factors):
            ref = st.get(f"ref_gg{i}")
            out.append(gg if gg is None or ref is None else torch.lerp(ref.to(gg), gg, lam))
        return out
