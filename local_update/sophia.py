"""SophiaG as a pure per-tensor rule (spec §2; Liu et al. 2023, the authors' `SophiaG`).

    m = β1·m + (1-β1)·g
    h̃ = (1-λ)·h^r + λ·h                       FedMIX-P (spec §4); h itself when λ = 1
    d = clip(m / max(ρ_s·bs·h̃, 1e-15), -1, 1)
    every k_h steps, AFTER the step:  h = β2·h + (1-β2)·ĝ²

ĝ is the Gauss-Newton-Bartlett estimate: the gradient of the loss on labels sampled from the
model's own softmax (`gnb_loss`). It costs one extra backward through the step's own forward
graph (no extra forward): `sophia_refresh_due` says when.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


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


def sophia_refresh_due(local_step: int, hessian_interval: int) -> bool:
    """Refresh after local steps 1, 1+k_h, 1+2k_h, … (so a short round still refreshes)."""
    return (local_step - 1) % hessian_interval == 0


def gnb_loss(logits: torch.Tensor, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
             generator: torch.Generator | None = None) -> torch.Tensor:
    """Loss on labels sampled from softmax(logits) (GNB, Sophia Alg. 2); logits [..., C]."""
    probs = torch.softmax(logits.detach().reshape(-1, logits.shape[-1]).float(), dim=-1)
    labels = torch.multinomial(probs, 1, generator=generator).view(logits.shape[:-1])
    return loss_fn(logits, labels)
