"""FedPAC's server (seed 001; spec §3): alignment and correction of preconditioner state Θ.

    x   <- x + mean Δ_i
    g_G <- -mean Δ_i / (K·lr)          sent next round when the correction is on (ρ = β > 0)
    Θ   <- mean Θ_i                    element-wise, by "<param>/<slot>" name (local_update/theta.py)

Clients warm-start from Θ (SOAP recomputes its eigenbasis from the averaged factors). With
`light=true` each Θ_i arrives compressed and is expanded to full shape before averaging. Per
round it reports the preconditioner drift mean_i Σ ||Θ_i - Θ̄||² and, with light, the upload's
compression ratio |Θ_i light| / |Θ_i full|.
"""

from __future__ import annotations

import torch
from adaptfl.algorithms import wire
from adaptfl.algorithms.recipe import recipe_for_round
from adaptfl.local_update.theta import Spec, drift, expand, light_spec, theta_spec
from adaptfl.strategies.aggregate import weighted_mean
from adaptfl.strategies.base import AdaptiveStrategy
from adaptfl.strategies.state import ServerState, Tensors
from adaptfl.strategies.validation import ArraySpec, DecodedReply


def spec_bytes(spec: Spec) -> int:
    return sum(torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
               for shape, dtype in spec.values())


class FedPACStrategy(AdaptiveStrategy):
    """Carries Θ (and g_G with the correction) alongside the model."""

    def theta_full_spec(self) -> Spec:
        names = self.spec.parameters
        dtype = self.spec.entries[names[0]][1]
        return theta_spec(self.resolved.preconditioner, [(n, self.spec.entries[n][0]) for n in names],
                          self.cfg.muon_routing, self.cfg.max_precond_dim, dtype)

    def theta_upload_spec(self) -> Spec:
        full = self.theta_full_spec()
        return light_spec(full, self.cfg.light_c) if self.cfg.light else full

    def reply_spec(self) -> dict[str, ArraySpec]:
        return {**super().reply_spec(), wire.THETA_LOCAL: self.theta_upload_spec()}

    def payload(self) -> dict[str, Tensors]:
        extras = {}
        if wire.THETA in self.state.extras:
            extras[wire.THETA] = self.state.extras[wire.THETA]
        if self.resolved.rho > 0.0 and wire.G_G in self.state.extras:
            extras[wire.G_G] = self.state.extras[wire.G_G]
        return extras

    def aggregate(self, server_round: int, replies: list[DecodedReply], weights: list[float],
                  mean_delta: Tensors) -> ServerState:
        new = super().aggregate(server_round, replies, weights, mean_delta)
        if self.resolved.rho > 0.0:
            recipe = recipe_for_round(self.cfg, server_round)
            scale = -1.0 / (recipe.local_steps * recipe.lr)
            new.extras[wire.G_G] = {n: mean_delta[n] * scale for n in self.spec.parameters}
        full = self.theta_full_spec()
        thetas = [r.arrays[wire.THETA_LOCAL] for r in replies]
        if self.cfg.light:
            thetas = [expand(t, full) for t in thetas]
        mean = weighted_mean(thetas, weights)
        new.extras[wire.THETA] = mean
        ratio = spec_bytes(self.theta_upload_spec()) / max(1, spec_bytes(full))  # |light| / |Θ|
        self.round_stats = {"preconditioner-drift": drift(thetas, mean), "theta-compression": ratio}
        return new
