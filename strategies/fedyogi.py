"""FedYogi: Yogi on the server over the pseudo-gradient Δ (Reddi et al. 2021, Alg. 2).

    m = β1·m + (1-β1)·Δ
    v = v - (1-β2)·Δ²·sign(v - Δ²)      (additive, sign-controlled: v grows slowly)
    x = x + η · m / (sqrt(v) + τ)       (no bias correction, as Flower's `FedYogi`)
"""

from __future__ import annotations

from adaptfl.strategies.fedadam import first_moment
from adaptfl.strategies.server_opt import ServerHyper, zeros_like
from adaptfl.strategies.state import Tensors


def fedyogi_rule(x: Tensors, delta: Tensors, moments: dict[str, Tensors], server_round: int,
                 hp: ServerHyper) -> tuple[Tensors, dict[str, Tensors]]:
    m = first_moment(delta, moments, hp.server_beta1)
    v = moments.get("v") or zeros_like(x)
    sq = {n: delta[n] ** 2 for n in x}
    v = {n: v[n] - (1.0 - hp.server_beta2) * sq[n] * (v[n] - sq[n]).sign() for n in x}
    new_x = {n: x[n] + hp.eta * m[n] / (v[n].sqrt() + hp.server_tau) for n in x}
    return new_x, {"m": m, "v": v}
