"""FedProx's proximal term (Li et al., MLSys 2020, Eq. 2):

    h_i(w) = f_i(w) + (μ/2)·||w - x^r||²

added to the loss before backward, so its gradient μ·(w - x^r) pulls every local step back
towards the round's global model.
"""

from __future__ import annotations

import torch
from adaptfl.client_app.terms import LocalTerm, RoundInputs


class ProxTerm(LocalTerm):
    def __init__(self, inputs: RoundInputs) -> None:
        if inputs.recipe.mu < 0.0:
            raise ValueError(f"invalid mu={inputs.recipe.mu}: FedProx needs μ >= 0")
        self.mu = inputs.recipe.mu
        self.start = inputs.start
        self.params = inputs.params

    def loss(self, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor | None:
        squares = [(p - self.start[n]).pow(2).sum() for n, p in self.params.items()]
        return 0.5 * self.mu * torch.stack(squares).sum()
