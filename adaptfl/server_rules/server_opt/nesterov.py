"""Nesterov server momentum: torch's `SGD(momentum=β, nesterov=True)` stepping x with the
pseudo-gradient p = -Δ (Δ = the mean model change of the round), DiLoCo's outer optimizer
(Douillard et al. 2023, Alg. 1: lr 0.7, momentum 0.9, the defaults here):

    m = β·m + p          no dampening; m = p at the first step (m starts at 0)
    x = x - η·(p + β·m)

FedAvgM (avgm.py) is the heavy-ball form x = x - η·m of the same momentum.
"""

from __future__ import annotations

from dataclasses import dataclass

from adaptfl.core.params import component, param
from adaptfl.server_rules.server_opt import ServerOpt, Tensors, zeros_like


@component("server_opt", "nesterov")
@dataclass(frozen=True)
class Nesterov(ServerOpt):
    eta: float = param(0.7, "server learning rate η", within=(0.0, None), open_low=True, sane=(0.0, 1e3))
    server_momentum: float = param(0.9, "Nesterov momentum β (torch's SGD momentum)",
                                   within=(0.0, 1.0), open_high=True)

    def rule(self, x: Tensors, delta: Tensors, moments: dict[str, Tensors], server_round: int
             ) -> tuple[Tensors, dict[str, Tensors]]:
        beta = self.server_momentum
        m = moments.get("momentum") or zeros_like(x)
        m = {n: beta * m[n] - delta[n] for n in x}  # p = -Δ
        return {n: x[n] - self.eta * (beta * m[n] - delta[n]) for n in x}, {"momentum": m}
