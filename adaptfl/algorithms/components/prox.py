"""FedProx's proximal term (Li et al., MLSys 2020, Eq. 2):

    h_i(w) = f_i(w) + (μ/2)·||w - x^r||²

added to the loss before backward, so its gradient μ·(w - x^r) pulls every local step back
towards the round's global model. Nothing crosses the wire beyond the model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from adaptfl.core.params import component, param
from adaptfl.core.stage import ClientPart, ClientRound, Stage


@component("term", "prox")
@dataclass(frozen=True)
class Prox(Stage):
    """(μ/2)·||w - x^r||² added to the local loss."""

    mu: float = param(0.01, "weight μ of the proximal term", within=(0.0, None), sane=(0.0, 1e4))

    def start(self, ctx: ClientRound) -> ClientPart:
        return _Prox(ctx, self.mu)


class _Prox(ClientPart):
    def __init__(self, ctx: ClientRound, mu: float) -> None:
        self.mu, self.start, self.params = mu, ctx.start, ctx.params

    def loss(self, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor | None:
        squares = [(p - self.start[n]).pow(2).sum() for n, p in self.params.items()]
        return 0.5 * self.mu * torch.stack(squares).sum()
