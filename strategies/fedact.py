"""The FedAdamW / FedACT family's server (seed 000, Algorithm 1, lines 22-25).

    x   <- x + mean Δ_i
    Δ_G <- -mean Δ_i / (K·lr)        (lr of the round; sent when correction is on, ρ > 0)
    v̄   <- mean v_i                  (full, or one mean per tensor with v-sync = "block")
"""

from __future__ import annotations

from adaptfl.algorithms import wire
from adaptfl.algorithms.recipe import recipe_for_round
from adaptfl.strategies.aggregate import weighted_mean
from adaptfl.strategies.base import AdaptiveStrategy
from adaptfl.strategies.state import ServerState, Tensors
from adaptfl.strategies.validation import ArraySpec, DecodedReply


class FedACTStrategy(AdaptiveStrategy):
    """Carries Δ_G and v̄ alongside the model."""

    def reply_spec(self) -> dict[str, ArraySpec]:
        spec = super().reply_spec()
        if self.resolved.v_sync != "none":
            spec[wire.V_LOCAL] = self.spec.params_spec(self.resolved.v_sync)
        return spec

    def payload(self) -> dict[str, Tensors]:
        extras = {}
        if self.resolved.rho > 0.0 and wire.DELTA_G in self.state.extras:
            extras[wire.DELTA_G] = self.state.extras[wire.DELTA_G]
        if self.resolved.v_sync != "none" and wire.V_BAR in self.state.extras:
            extras[wire.V_BAR] = self.state.extras[wire.V_BAR]
        return extras

    def aggregate(self, server_round: int, replies: list[DecodedReply], weights: list[float],
                  mean_delta: Tensors) -> ServerState:
        new = super().aggregate(server_round, replies, weights, mean_delta)
        recipe = recipe_for_round(self.cfg, server_round)
        scale = -1.0 / (recipe.local_steps * recipe.lr)
        if self.resolved.rho > 0.0:
            new.extras[wire.DELTA_G] = {n: mean_delta[n] * scale for n in self.spec.parameters}
        if self.resolved.v_sync != "none":
            new.extras[wire.V_BAR] = weighted_mean([r.arrays[wire.V_LOCAL] for r in replies],
                                                   weights)
        return new
