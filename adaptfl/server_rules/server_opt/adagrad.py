"""FedAdagrad: Adagrad on the server over the pseudo-gradient Δ (Reddi et al. 2021, Alg. 2).

    v = v + Δ²
    x = x + η · Δ / (sqrt(v) + τ)       (β1 = 0: no momentum, as Flower's `FedAdagrad`)
"""

from __future__ import annotations

from dataclasses import dataclass

from adaptfl.core.domain import NONNEG, SQUARABLE
from adaptfl.core.params import component, param
from adaptfl.server_rules.server_opt import ServerOpt, Tensors, zeros_like


@component("server_opt", "adagrad")
@dataclass(frozen=True)
class ServerAdagrad(ServerOpt):
    delta_domain = SQUARABLE  # the rule squares Δ
    moment_domains = {"v": NONNEG}
    eta: float = param(0.01, "server learning rate η", within=(0.0, None), open_low=True, sane=(0.0, 1e3))
    server_tau: float = param(1e-3, "adaptivity τ of Reddi et al. (Flower: tau)", within=(0.0, None),
                              open_low=True)

    def rule(self, x: Tensors, delta: Tensors, moments: dict[str, Tensors], server_round: int
             ) -> tuple[Tensors, dict[str, Tensors]]:
        v = moments.get("v") or zeros_like(x)
        v = {n: v[n] + delta[n] ** 2 for n in x}
        return {n: x[n] + self.eta * delta[n] / (v[n].sqrt() + self.server_tau) for n in x}, {"v": v}
