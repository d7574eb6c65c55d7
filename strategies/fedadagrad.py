"""FedAdagrad: Adagrad on the server over the pseudo-gradient Δ (Reddi et al. 2021, Alg. 2).

    v = v + Δ²
    x = x + η · Δ / (sqrt(v) + τ)       (β1 = 0: no momentum, as Flower's `FedAdagrad`)
"""

from __future__ import annotations

from adaptfl.strategies.server_opt import ServerHyper, zeros_like
from adaptfl.strategies.state import Tensors


def fedadagrad_rule(x: Tensors, delta: Tensors, moments: dict[str, Tensors], server_round: int,
                    hp: ServerHyper) -> tuple[Tensors, dict[str, Tensors]]:
    v = moments.get("v") or zeros_like(x)
    v = {n: v[n] + delta[n] ** 2 for n in x}
    new_x = {n: x[n] + hp.eta * delta[n] / (v[n].sqrt() + hp.server_tau) for n in x}
    return new_x, {"v": v}
