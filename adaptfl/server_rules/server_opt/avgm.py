"""FedAvgM: server momentum on the pseudo-gradient (Hsu, Qi & Brown 2019, Eq. 2).

    p = -Δ                      (pseudo-gradient, Δ = mean model change)
    m = β·m + p                 (no dampening; m = p at the first step, as m starts at 0)
    x = x - η·m

Flower's `FedAvgM(server_learning_rate=η, server_momentum=β)` computes exactly this.
"""

from __future__ import annotations

from dataclasses import dataclass

from adaptfl.core.params import component, param
from adaptfl.server_rules.server_opt import ServerOpt, Tensors, zeros_like


@component("server_opt", "avgm")
@dataclass(frozen=True)
class AvgM(ServerOpt):
    eta: float = param(1.0, "server learning rate η", within=(0.0, None), open_low=True, sane=(0.0, 1e3))
    server_momentum: float = param(0.9, "FedAvgM's β (Flower: server_momentum)", within=(0.0, 1.0),
                                   open_high=True)

    def rule(self, x: Tensors, delta: Tensors, moments: dict[str, Tensors], server_round: int
             ) -> tuple[Tensors, dict[str, Tensors]]:
        m = moments.get("momentum") or zeros_like(x)
        m = {n: self.server_momentum * m[n] - delta[n] for n in x}
        return {n: x[n] - self.eta * m[n] for n in x}, {"momentum": m}
