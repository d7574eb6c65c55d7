"""SophiaG as a pure rule (Liu et al. 2023, the authors' `SophiaG`).

    m = β1·m + (1-β1)·g
    h̃ = (1-λ)·h^r + λ·h                       FedMIX-P (seed 002); h itself when λ = 1
    d = clip(m / max(ρ_s·bs·h̃, 1e-15), -1, 1)
    every k_h steps, AFTER the step:  h = β2·h + (1-β2)·ĝ²

ĝ is the Gauss-Newton-Bartlett estimate: the gradient of the loss on labels sampled from the
model's own softmax (`gnb_loss`). It costs one extra backward through the step's own forward
graph (no extra forward): `refresh_due` says when.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from adaptfl.core.domain import NONNEG, Domain
from adaptfl.core.params import component, param
from adaptfl.local_update.rules import Direction, Preconditioner, Step


def sophia_direction(g: torch.Tensor, exp_avg: torch.Tensor, hessian: torch.Tensor, beta1: float,
                     rho: float, bs: int, reference: torch.Tensor | None = None,
                     lam: float = 1.0) -> torch.Tensor:
    """d for this step; updates `exp_avg` in place. `hessian` is the client's own h."""
    exp_avg.lerp_(g, 1.0 - beta1)
    h = hessian if reference is None or lam == 1.0 else torch.lerp(reference, hessian, lam)
    denom = (h * (rho * bs)).clamp_(min=1e-15)
    return torch.div(exp_avg, denom).clamp_(-1.0, 1.0)


def hessian_update_(hessian: torch.Tensor, g_hat: torch.Tensor, beta2: float) -> None:
    """h = β2·h + (1-β2)·ĝ² (the diagonal GNB estimate, up to the bs factor in the step)."""
    hessian.mul_(beta2).addcmul_(g_hat, g_hat, value=1.0 - beta2)


def gnb_loss(logits: torch.Tensor, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
             generator: torch.Generator | None = None) -> torch.Tensor:
    """Loss on labels sampled from softmax(logits) (GNB, Sophia Alg. 2); logits [..., C]."""
    probs = torch.softmax(logits.detach().reshape(-1, logits.shape[-1]).float(), dim=-1)
    labels = torch.multinomial(probs, 1, generator=generator).view(logits.shape[:-1])
    return loss_fn(logits, labels)


@component("preconditioner", "sophia")
@dataclass(frozen=True)
class Sophia(Preconditioner):
    """SophiaG with the GNB Hessian refresh (which MUST run: seed 001 notes that the authors'
    code never calls it)."""

    sophia_rho: float = param(0.04, "Sophia's ρ_s in clip(m / max(ρ_s·bs·h, 1e-15))",
                              within=(0.0, None), open_low=True)
    sophia_beta1: float = param(0.965, "Sophia's momentum β1", within=(0.0, 1.0), open_high=True)
    sophia_beta2: float = param(0.99, "Sophia's Hessian EMA β2", within=(0.0, 1.0), open_high=True)
    hessian_interval: int = param(10, "k_h: GNB Hessian refresh every k_h local steps", within=(1, None))

    torch_names = {"betas": ("sophia_beta1", "sophia_beta2")}  # SophiaG's
    default_lr = 1e-3  # its update is clipped to ±1 per coordinate, like sign descent
    default_weight_decay = 0.1
    slots = ("exp_avg", "hessian")
    theta_slots = ("hessian",)
    shareable = True
    needs_loss = True

    def theta_domain(self, slot: str) -> Domain:
        return NONNEG  # h is an EMA of ĝ²: a negative h turns clip(m / max(ρ·bs·h, ε)) to sign(m)

    def direction(self, g: torch.Tensor, st: dict[str, Any], step: Step) -> Direction:
        d = sophia_direction(g, st["exp_avg"], st["hessian"], self.sophia_beta1, self.sophia_rho,
                             step.bs, st.get("ref_hessian"), step.lam)
        return Direction(d)

    def refresh_due(self, k: int) -> bool:
        """Refresh after local steps 1, 1+k_h, 1+2k_h, … (so a short round still refreshes)."""
        return (k - 1) % self.hessian_interval == 0

    def extra_loss(self, logits: torch.Tensor, loss_fn: Any) -> torch.Tensor:
        return gnb_loss(logits, loss_fn)

    def refresh(self, st: dict[str, Any], g_hat: torch.Tensor) -> None:
        hessian_update_(st["hessian"], g_hat, self.sophia_beta2)
