"""Trust modulation as components: which rule scales u <- φ ⊙ u, with its keys (seed 000, Eq. 7-9).

- `none`: φ ≡ 1.
- `act`: φ = α on the top ⌊τD⌋ of the scores s = u ⊙ g, γ elsewhere (FedACT). Scope `global`
  ranks over ALL coordinates of the model, `per-tensor` within each tensor. γ = 0 is the paper's
  hard-masking ablation (Table 4).
- `mgup`: the same α/γ split, always ranked within each tensor, as MGUP's code does.
- `cautious`: φ = 1[s > 0] rescaled by D / (nnz + 1) (C-AdamW's mask).

These classes only declare and check the hyperparameters: the math is the reference's
(`step/reference.py`, `modulate`) and the fast forms' (`step/fused.py`: trust.py's radix
selection; `step/native.py`: the C loops), which `step/choose.py` picks between. A rule of the
user's own overrides `phi_` (it then runs through the fused form's chain, never natively).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from adaptfl.core.params import Component, component, param

if TYPE_CHECKING:
    from adaptfl.local_update.workspace import Workspace


class Trust(Component):
    """Base: φ ≡ 1."""

    active = False  # whether φ is not 1 (the shell skips the scores otherwise)
    mode = "none"  # the built-in math this rule is (trust.py's modes); a user's rule: its phi_

    def phi_(self, scores: torch.Tensor, sizes: Sequence[int], ws: Workspace,
             scale: float = 1.0) -> torch.Tensor:
        """scale·φ from the scores s = u ⊙ g, written over them (the step is x += scale·φ ⊙ u
        with scale = -lr, so the shell folds the lr in here and saves a pass). The built-in
        rules' φ is the fused form's (`step.fused.phi_`); a rule of the user's overrides this."""
        return scores.fill_(scale)


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
    mode = "act"

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


@component("trust", "act")
@dataclass(frozen=True)
class ACT(_Ranked):
    """FedACT's adaptive coordinate trust."""

    trust_scope: str = param("global", "rank the scores over the whole model (global) or within "
                             "each tensor (per-tensor)", choices=("global", "per-tensor"))

    @property
    def per_tensor(self) -> bool:  # type: ignore[override]
        return self.trust_scope == "per-tensor"


@component("trust", "mgup")
@dataclass(frozen=True)
class MGUP(_Ranked):
    """MGUP (Chang & Yuan 2025): α/γ ranked within each tensor."""

    mode = "mgup"


@component("trust", "cautious")
@dataclass(frozen=True)
class Cautious(Trust):
    """C-AdamW's mask (Liang et al. 2024)."""

    active = True
    mode = "cautious"
