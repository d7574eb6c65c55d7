"""Adam and AdamW as pure rules on flat tensors (seed 000, Eq. 4-5), with torch's slot names.

    m = β1·m + (1-β1)·g;  v = β2·v + (1-β2)·g²;  d = m̂ / (sqrt(v̂) + ε)

`bias_correction` says which step counts the corrections 1-β^n use: `paper` m on the local step
k and v on the global step t (FedACT's Algorithm 1, lines 11-12: v is synced across rounds);
`single-counter` both on t (the FedAdamW authors' code); `local` both on k (a fresh
`torch.optim.AdamW` each round); `off` none (FedLADA). Adam adds the coupled L2 term wd·x to g
first, as `torch.optim.Adam(weight_decay=...)`; AdamW decays x in the step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from adaptfl.core.params import component, param
from adaptfl.local_update.rules import Direction, Preconditioner, Step

BIAS_MODES = ("paper", "single-counter", "local", "off")
def bias_steps(mode: str, k: int, t: int) -> tuple[int, int]:
    """Exponents (for m, for v) of the bias corrections 1-β^n; 0 means no correction."""
    return {"paper": (k, t), "single-counter": (t, t), "local": (k, k), "off": (0, 0)}[mode]


def kernel_arguments(beta1: float, n_m: int, n_v: int, weight: float) -> tuple[float, float]:
    """(lr, step) for torch's fused AdamW kernel to add weight·m̂/(sqrt(v̂)+ε) to its buffer
    with m's correction on n_m and v's on n_v: the kernel takes one step count for both, so it
    gets n_v (inf: no correction, β^inf = 0) and lr carries bc1(n_v)/bc1(n_m) for m."""
    m_over_v = (1.0 - beta1**n_v if n_v else 1.0) / (1.0 - beta1**n_m if n_m else 1.0)
    return -weight * m_over_v, float(n_v) if n_v else math.inf


def kernel_coefficients(beta1: float, beta2: float, eps: float, lr: float, step: float,
                      out: torch.Tensor) -> torch.Tensor:
    """The coefficients torch's fused AdamW kernel derives from its arguments (in double from
    the float32 step count, then rounded to float): 1-β1, β2, 1-β2, sqrt(1-β2^t), ε and
    -lr/(1-β1^t); FedACT's native loops (step/native.py) run the kernel's pass with them."""
    t = float(np.float32(step))  # the kernel reads its step count as a float
    out.numpy()[:] = (1.0 - beta1, beta2, 1.0 - beta2, math.sqrt(1.0 - beta2**t), eps,
                      -(lr / (1.0 - beta1**t)))
    return out



@component("preconditioner", "adamw")
@dataclass(frozen=True)
class AdamW(Preconditioner):
    """AdamW: Adam's direction, decoupled weight decay (Loshchilov & Hutter 2019)."""

    torch_names = {"betas": ("beta1", "beta2")}  # torch.optim.AdamW's

    beta1: float = param(0.9, "first-moment EMA weight β1", within=(0.0, 1.0), open_high=True)
    beta2: float = param(0.999, "second-moment EMA weight β2", within=(0.0, 1.0), open_high=True)
    eps: float = param(1e-8, "ε added to sqrt(v̂)", within=(0.0, None), open_low=True)
    bias_correction: str = param("paper", "which step count the bias corrections use: paper (m on "
                                 "the local step, v on the global step), single-counter, local, off",
                                 choices=BIAS_MODES)

    default_lr = 1e-3  # the adaptive family's main-job lr (FedACT's Table 6 tunes 1e-4..1e-3)
    default_weight_decay = 0.01
    slots = ("exp_avg", "exp_avg_sq")

    def direction(self, g: torch.Tensor, st: dict[str, Any], step: Step) -> Direction:
        # torch's fused kernel, as AdamW(fused=True) rounds; imported here so that the rule
        # (and step/reference.py, which has its own plain formula) loads without the fast forms
        from adaptfl.local_update.step.fused_adam import adam_direction_

        n_m, n_v = bias_steps(self.bias_correction, step.k, step.t)
        d, scale, _ = adam_direction_(st["exp_avg"], st["exp_avg_sq"], g, self.beta1, self.beta2,
                                      self.eps, n_m, n_v)
        return Direction(d, scale)


@component("preconditioner", "adam")
@dataclass(frozen=True)
class Adam(AdamW):
    """Adam with coupled L2 weight decay, as `torch.optim.Adam(weight_decay=...)`."""

    default_weight_decay = 1e-3
    coupled_decay = True
