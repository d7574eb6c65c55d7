"""FedDyn's server (Acar et al., ICLR 2021, Alg. 1):

    h^t = h^{t-1} - α·(1/N)·Σ_{i∈S}(θ_i^t - θ^{t-1})  = h^{t-1} - α·(|S|/N)·mean Δ_i
    θ^t = mean θ_i^t - h^t / α                         = θ^{t-1} + mean Δ_i - h^t / α

h (parameters only, zero at the start) is server state; nothing but the model crosses the wire.
"""

from __future__ import annotations

import torch
from adaptfl.strategies.base import AdaptiveStrategy
from adaptfl.strategies.state import ServerState, Tensors
from adaptfl.strategies.validation import DecodedReply

H = "feddyn-h"  # extras slot of h (server only)


class FedDynStrategy(AdaptiveStrategy):
    def aggregate(self, server_round: int, replies: list[DecodedReply], weights: list[float],
                  mean_delta: Tensors) -> ServerState:
        new = super().aggregate(server_round, replies, weights, mean_delta)
        alpha = self.cfg.dyn_alpha
        h = self.state.extras.get(H) or {n: torch.zeros_like(self.state.model[n])
                                          for n in self.spec.parameters}
        share = len(replies) / max(self.num_nodes, len(replies))  # |S| / N
        h = {n: h[n] - alpha * share * mean_delta[n].to(h[n]) for n in h}
        for n in h:
            new.model[n] = new.model[n] - h[n] / alpha
        new.extras[H] = h
        return new
