"""FedAdam: Adam on the server over the pseudo-gradient Δ (Reddi et al. 2021, Alg. 2).

    m = β1·m + (1-β1)·Δ
    v = β2·v + (1-β2)·Δ²
    x = x + η_r · m / (sqrt(v) + τ),   η_r = η·sqrt(1-β2^(r+1)) / (1-β1^(r+1))

The bias-corrected η_r on `r+1` (r = server round) is Flower's `FedAdam` convention, kept so
the same replies give the same model as Flower's strategy (tests/test_server_opt.py).
"""

from __future__ import annotations

import math

from adaptfl.strategies.server_opt import ServerHyper, zeros_like
from adaptfl.strategies.state import Tensors


def first_moment(delta: Tensors, moments: dict[str, Tensors], beta1: float) -> Tensors:
    """m = β1·m + (1-β1)·Δ (FedOpt's shared stage)."""
    m = moments.get("m") or zeros_like(delta)
    return {n: beta1 * m[n] + (1.0 - beta1) * delta[n] for n in delta}


def fedadam_rule(x: Tensors, delta: Tensors, moments: dict[str, Tensors], server_round: int,
                 hp: ServerHyper) -> tuple[Tensors, dict[str, Tensors]]:
    b1, b2 = hp.server_beta1, hp.server_beta2
    m = first_moment(delta, moments, b1)
    v = moments.get("v") or zeros_like(x)
    v = {n: b2 * v[n] + (1.0 - b2) * delta[n] ** 2 for n in x}
    eta_r = hp.eta * math.sqrt(1.0 - b2 ** (server_round + 1)) / (1.0 - b1 ** (server_round + 1))
    new_x = {n: x[n] + eta_r * m[n] / (v[n].sqrt() + hp.server_tau) for n in x}
    return new_x, {"m": m, "v": v}
