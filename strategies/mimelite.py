"""MimeLite's server (Karimireddy et al. 2021, Alg. 2, momentum-SGD base optimizer):

    x <- x + mean Δ_i
    m <- (1-β)·mean ∇f_i(x) + β·m       (∇f_i(x): each client's full local gradient at x)

m is sent as `delta-g` every round (zeros in round 1, so round 1 already steps with (1-β)·g as
the paper's initial state m = 0 implies); clients mix u = (1-β)·g + β·m with ρ = β.
"""

from __future__ import annotations

import torch
from adaptfl.algorithms import wire
from adaptfl.strategies.aggregate import weighted_mean
from adaptfl.strategies.base import AdaptiveStrategy
from adaptfl.strategies.state import ServerState, Tensors
from adaptfl.strategies.validation import ArraySpec, DecodedReply

M = "mime-m"  # extras slot of the server momentum m


class MimeLiteStrategy(AdaptiveStrategy):
    def reply_spec(self) -> dict[str, ArraySpec]:
        return {**super().reply_spec(), wire.GRAD_AT_X: self.spec.params_spec()}

    def _momentum(self) -> Tensors:
        return self.state.extras.get(M) or {n: torch.zeros_like(self.state.model[n])
                                            for n in self.spec.parameters}

    def payload(self) -> dict[str, Tensors]:
        return {wire.DELTA_G: self._momentum()}

    def aggregate(self, server_round: int, replies: list[DecodedReply], weights: list[float],
                  mean_delta: Tensors) -> ServerState:
        new = super().aggregate(server_round, replies, weights, mean_delta)
        beta = self.resolved.rho  # ρ = β (presets: MimeLite's ρ comes from beta1)
        grad = weighted_mean([r.arrays[wire.GRAD_AT_X] for r in replies], weights)
        m = self._momentum()
        new.extras[M] = {n: (1.0 - beta) * grad[n] + beta * m[n] for n in m}
        return new
