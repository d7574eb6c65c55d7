"""SCAFFOLD's server (Karimireddy et al., ICML 2020, Alg. 1, lines 16-17):

    x <- x + η_g·mean Δy_i              (η_g and any server rule: strategies/server_opt.py)
    c <- c + (|S|/N)·mean Δc_i          (N = connected clients)

c (zero until the first aggregation) goes down with the model; Δy_i and Δc_i come up.
"""

from __future__ import annotations

import torch
from adaptfl.algorithms import wire
from adaptfl.strategies.aggregate import weighted_mean
from adaptfl.strategies.base import AdaptiveStrategy
from adaptfl.strategies.state import ServerState, Tensors
from adaptfl.strategies.validation import ArraySpec, DecodedReply


class ScaffoldStrategy(AdaptiveStrategy):
    def reply_spec(self) -> dict[str, ArraySpec]:
        return {**super().reply_spec(), wire.DELTA_C: self.spec.params_spec()}

    def payload(self) -> dict[str, Tensors]:
        return {wire.SCAFFOLD_C: self.state.extras[wire.SCAFFOLD_C]} \
            if wire.SCAFFOLD_C in self.state.extras else {}

    def aggregate(self, server_round: int, replies: list[DecodedReply], weights: list[float],
                  mean_delta: Tensors) -> ServerState:
        new = super().aggregate(server_round, replies, weights, mean_delta)
        mean_dc = weighted_mean([r.arrays[wire.DELTA_C] for r in replies], weights)
        c = self.state.extras.get(wire.SCAFFOLD_C) or {n: torch.zeros_like(t)
                                                       for n, t in mean_dc.items()}
        share = len(replies) / max(self.num_nodes, len(replies))  # |S| / N
        new.extras[wire.SCAFFOLD_C] = {n: c[n] + share * mean_dc[n] for n in c}
        return new
