"""HaFedHo's server (seed 003, Algorithm 1; spec §5).

    x   <- x + mean Δ_i                 (= w - η·mean g_i for the clients' plain SGD)
    g^t  = mean g_i = -mean Δ_i / lr    (g_i = Σ_k ∇φ_i(w_k) = -Δ_i / lr, lr of the round)
    f̂^t  = mean f̂_i                     (the clients' mean local losses, a scalar each)

and sends g^t and f̂^t with the next round's model. Clients apply the participation rule
themselves (client_app/term_hafedho.py); a reply without `f-hat` is dropped.
"""

from __future__ import annotations

import torch
from adaptfl.algorithms import wire
from adaptfl.algorithms.recipe import recipe_for_round
from adaptfl.strategies.base import AdaptiveStrategy
from adaptfl.strategies.state import ServerState, Tensors
from adaptfl.strategies.validation import DecodedReply, ReplyRejected


class HaFedHoStrategy(AdaptiveStrategy):
    def payload(self) -> dict[str, Tensors]:
        return {name: self.state.extras[name] for name in (wire.HAFEDHO_G, wire.HAFEDHO_F_HAT)
                if name in self.state.extras}

    def check_reply(self, reply: DecodedReply) -> None:
        if wire.F_HAT not in reply.metrics:
            raise ReplyRejected(f"{wire.METRICS}: missing keys ['{wire.F_HAT}'] (HaFedHo's f̂_i)")

    def aggregate(self, server_round: int, replies: list[DecodedReply], weights: list[float],
                  mean_delta: Tensors) -> ServerState:
        new = super().aggregate(server_round, replies, weights, mean_delta)
        lr = recipe_for_round(self.cfg, server_round).lr
        new.extras[wire.HAFEDHO_G] = {n: -mean_delta[n] / lr for n in self.spec.parameters}
        f_hat = sum(w * float(r.metrics[wire.F_HAT]) for r, w in zip(replies, weights, strict=True))
        new.extras[wire.HAFEDHO_F_HAT] = {"f-hat": torch.tensor([f_hat / sum(weights)])}
        return new
