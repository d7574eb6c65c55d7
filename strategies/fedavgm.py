"""FedAvgM: server momentum on the pseudo-gradient (Hsu, Qi & Brown 2019, Eq. 2).

    p = -Δ                      (pseudo-gradient, Δ = mean model change)
    m = β·m + p                 (no dampening; m = p at the first step, as m starts at 0)
    x = x - η·m

Flower's `FedAvgM(server_learning_rate=η, server_momentum=β)` computes exactly this; here
β is `server-momentum` and η is `eta`.
"""

from __future__ import annotations

from adaptfl.strategies.server_opt import ServerHyper, zeros_like
from adaptfl.strategies.state import Tensors


def fedavgm_rule(x: Tensors, delta: Tensors, moments: dict[str, Tensors], server_round: int,
                 hp: ServerHyper) -> tuple[Tensors, dict[str, Tensors]]:
    m = moments.get("momentum") or zeros_like(x)
    m = {n: hp.server_momentum * m[n] - delta[n] for n in x}
    return {n: x[n] - hp.eta * m[n] for n in x}, {"momentum": m}
