"""FedYogi: Yogi on the server over the pseudo-gradient Δ (Reddi et al. 2021, Alg. 2).

    m = β1·m + (1-β1)·Δ
    v = v - (1-β2)·Δ²·sign(v - Δ²)      (additive, sign-controlled: v grows slowly)
    x = x + η · m / (sqrt(v) + τ)       (no bias correction, as Flower's `FedYogi`)
"""

from __future__ import annotations

from dataclasses import dataclass

from adaptfl.core.params import component
from adaptfl.server_rules.server_opt import Tensors, zeros_like
from adaptfl.server_rules.server_opt.adam import ServerAdam, first_moment


@component("server_opt", "yogi")
@dataclass(frozen=True)
class ServerYogi(ServerAdam):
    def rule(self, x: Tensors, delta: Tensors, moments: dict[str, Tensors], server_round: int
             ) -> tuple[Tensors, dict[str, Tensors]]:
        m = first_moment(delta, moments, self.server_beta1)
        v = moments.get("v") or zeros_like(x)
        sq = {n: delta[n] ** 2 for n in x}
        v = {n: v[n] - (1.0 - self.server_beta2) * sq[n] * (v[n] - sq[n]).sign() for n in x}
        return {n: x[n] + self.eta * m[n] / (v[n].sqrt() + self.server_tau) for n in x}, {"m": m, "v": v}
