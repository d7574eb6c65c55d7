"""Preconditioners g -> d as pure rules on flat tensors, with torch's slot names.

Each rule updates its state in place and returns the direction d; weight decay and the lr are
applied later by the step (decoupled), except `adam`, whose coupled L2 term is added to g first
(as `torch.optim.Adam(weight_decay=...)` does).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

PRECONDITIONERS = ("sgd", "adam", "adamw")
BIAS_MODES = ("paper", "single-counter", "local", "off")


@dataclass(frozen=True)
class AdamHyper:
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    bias_correction: str = "local"

    def __post_init__(self) -> None:
        if not 0.0 <= self.beta1 < 1.0:
            raise ValueError(f"invalid beta1={self.beta1}: must be in [0, 1)")
        if not 0.0 <= self.beta2 < 1.0:
            raise ValueError(f"invalid beta2={self.beta2}: must be in [0, 1)")
        if not self.eps > 0.0:
            raise ValueError(f"invalid eps={self.eps}: must be > 0")
        if self.bias_correction not in BIAS_MODES:
            raise ValueError(f"invalid bias-correction={self.bias_correction!r}: "
                             f"choose one of {BIAS_MODES}")


def bias_steps(mode: str, k: int, t: int) -> tuple[int, int]:
    """Exponents (for m, for v) of the bias corrections 1-β^n; 0 means no correction.

    `k` is the local step (from 1 each round), `t` the global step ((r-1)·K + k).
    paper: m on k, v on t (seed 000, Alg. 1 lines 11-12); single-counter: both on t (the
    FedAdamW authors' code); local: both on k (a fresh AdamW each round); off: none (FedLADA).
    """
    return {"paper": (k, t), "single-counter": (t, t), "local": (k, k), "off": (0, 0)}[mode]


def adam_direction_(exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor, g: torch.Tensor,
                    hp: AdamHyper, k: int, t: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """m = β1 m + (1-β1) g; v = β2 v + (1-β2) g²; d = m̂ / (sqrt(v̂) + ε)  (seed 000, Eq. 4-5).

    d is written to `out` (a fresh tensor if None), which also holds the denominator first.
    """
    exp_avg.lerp_(g, 1.0 - hp.beta1)
    exp_avg_sq.mul_(hp.beta2).addcmul_(g, g, value=1.0 - hp.beta2)
    n_m, n_v = bias_steps(hp.bias_correction, k, t)
    bc1 = 1.0 - hp.beta1**n_m if n_m else 1.0
    bc2 = 1.0 - hp.beta2**n_v if n_v else 1.0
    denom = torch.sqrt(exp_avg_sq, out=out).div_(math.sqrt(bc2)).add_(hp.eps)
    return torch.div(exp_avg, denom, out=denom).div_(bc1)


def new_state(preconditioner: str, numel: int, like: torch.Tensor) -> dict[str, torch.Tensor]:
    """Fresh flat state for `numel` coordinates (zeros, as torch.optim does)."""
    if preconditioner == "sgd":
        return {}
    if preconditioner in ("adam", "adamw"):
        return {"exp_avg": like.new_zeros(numel), "exp_avg_sq": like.new_zeros(numel)}
    raise ValueError(f"unknown preconditioner {preconditioner!r}; known: {PRECONDITIONERS}")


def direction_(preconditioner: str, state: dict[str, torch.Tensor], g: torch.Tensor,
               hp: AdamHyper, k: int, t: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """d for this step, in `out` if given; updates `state` in place.

    sgd returns a copy of g (u is modified later).
    """
    if preconditioner == "sgd":
        return g.clone() if out is None else out.copy_(g)
    return adam_direction_(state["exp_avg"], state["exp_avg_sq"], g, hp, k, t, out)
