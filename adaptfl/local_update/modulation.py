"""Trust modulation as components: which rule scales u <- φ ⊙ u, with its keys (seed 000, Eq. 7-9).

- `none`: φ ≡ 1.
- `act`: φ = α on the top ⌊τD⌋ of the scores s = u ⊙ g, γ elsewhere (FedACT). Scope `global`
  ranks over ALL coordinates of the model, `per-tensor` within each tensor. γ = 0 is the paper's
  hard-masking ablation (Table 4).
- `mgup`: the same α/γ split, always ranked within each tensor, as MGUP's code does.
- `cautious`: φ = 1[s > 0] rescaled by D / (nnz + 1) (C-AdamW's mask).

The math is in trust.py / topk.py; these classes only declare and check the hyperparameters.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from adaptfl.core.params import Component, component, param
from adaptfl.local_update.fused_act import act_step_
from adaptfl.local_update.trust import phi_
from adaptfl.local_update.workspace import Workspace


class Trust(Component):
    """Base: φ ≡ 1."""

    active = False  # whether φ is not 1 (the shell skips the scores otherwise)
    takes_pending = False  # whether `step_` may run the rule's pending last pass itself

    def phi_(self, scores: torch.Tensor, sizes: Sequence[int], ws: Workspace,
             scale: float = 1.0) -> torch.Tensor:
        """scale·φ from the scores s = u ⊙ g, written over them (the step is x += scale·φ ⊙ u
        with scale = -lr, so the shell folds the lr in here and saves a pass)."""
        return scores.fill_(scale)

    def step_(self, x: torch.Tensor, u: torch.Tensor, g: torch.Tensor, scale: float,
              decay: float | None, ws: Workspace, grads: list[torch.Tensor] | None = None,
              grad_views: list[torch.Tensor] | None = None, pending: Any = None) -> bool:
        """x = decay·x + (scale·φ) ⊙ u from s = u ⊙ g in fewer passes than `phi_` and the step,
        where a rule can (g may be overwritten; with `grads`, g is still to be filled from
        them, into its `grad_views`; with `pending`, u is still to be written by that pass,
        which step_ then runs, maybe as part of its own); False, nothing touched (nor run),
        where it cannot."""
        return False



@component("trust", "none")
@dataclass(frozen=True)
class NoTrust(Trust):
    """No modulation."""


@dataclass(frozen=True)
class _Ranked(Trust):
    tau: float = param(0.5, "trust ratio τ: the top ⌊τD⌋ scores are trusted", within=(0.0, 1.0),
                       open_low=True)
    alpha: float | None = param(None, "scale α of trusted coordinates; preset: 1/τ (the paper's)",
                                within=(0.0, None), open_low=True, sane=(0.0, 1e3))
    gamma: float | None = param(None, "scale γ of the others; preset: τ; 0: hard masking (Table 4)",
                                within=(0.0, None))

    active = True
    per_tensor = True

    @property
    def trust_alpha(self) -> float:
        return 1.0 / self.tau if self.alpha is None else self.alpha

    @property
    def trust_gamma(self) -> float:
        return self.tau if self.gamma is None else self.gamma

    def check(self) -> None:
        if self.trust_gamma > self.trust_alpha:
            raise ValueError(f"invalid gamma={self.trust_gamma:g}: must not exceed alpha="
                             f"{self.trust_alpha:g} (trusted coordinates get α ≥ γ)")

    def phi_(self, scores: torch.Tensor, sizes: Sequence[int], ws: Workspace,
             scale: float = 1.0) -> torch.Tensor:
        return phi_(scores, "act", self.tau, self.trust_alpha, self.trust_gamma, sizes,
                    per_tensor=self.per_tensor, ws=ws, scale=scale)


@component("trust", "act")
@dataclass(frozen=True)
class ACT(_Ranked):
    """FedACT's adaptive coordinate trust."""

    trust_scope: str = param("global", "rank the scores over the whole model (global) or within "
                             "each tensor (per-tensor)", choices=("global", "per-tensor"))

    @property
    def per_tensor(self) -> bool:  # type: ignore[override]
        return self.trust_scope == "per-tensor"

    @property
    def takes_pending(self) -> bool:  # type: ignore[override]
        return not self.per_tensor

    def step_(self, x: torch.Tensor, u: torch.Tensor, g: torch.Tensor, scale: float,
              decay: float | None, ws: Workspace, grads: list[torch.Tensor] | None = None,
              grad_views: list[torch.Tensor] | None = None, pending: Any = None) -> bool:
        return not self.per_tensor and act_step_(x, u, g, self.tau, self.trust_alpha,
                                                 self.trust_gamma, scale, decay, ws, grads,
                                                 grad_views, pending)


@component("trust", "mgup")
@dataclass(frozen=True)
class MGUP(_Ranked):
    """MGUP (Chang & Yuan 2025): α/γ ranked within each tensor."""


@component("trust", "cautious")
@dataclass(frozen=True)
class Cautious(Trust):
    """C-AdamW's mask (Liang et al. 2024)."""

    active = True

    def phi_(self, scores: torch.Tensor, sizes: Sequence[int], ws: Workspace,
             scale: float = 1.0) -> torch.Tensor:
        return phi_(scores, "cautious", 0.5, 1.0, 1.0, sizes, per_tensor=False, ws=ws, scale=scale)
