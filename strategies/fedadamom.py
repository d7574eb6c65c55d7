"""FedAdamom: adaptivity moved from the step size to the momentum coefficient (seed 004).

    v  = b2·v + (1-b2)·Δ²              b2 weights the OLD v (0.05 best in the seed)
    v̄  = Σ v / D                       ONE scalar over all D coordinates of the model
    β1 = clip(1 - v / v̄, 0, 1-ε)       per coordinate, ε = 1e-3
    m  = β1·m + (1-β1)·Δ
    x  = x + η·m                       η = 1; no 1/sqrt(v) scaling, no bias correction

A coordinate whose second moment is large relative to the model's mean gets a short momentum
memory; a quiet one keeps its momentum (seed 004, §"自适应动量参数").
"""

from __future__ import annotations

import torch
from adaptfl.strategies.server_opt import ServerHyper, zeros_like
from adaptfl.strategies.state import Tensors


def fedadamom_rule(x: Tensors, delta: Tensors, moments: dict[str, Tensors], server_round: int,
                   hp: ServerHyper) -> tuple[Tensors, dict[str, Tensors]]:
    v = moments.get("v") or zeros_like(x)
    m = moments.get("m") or zeros_like(x)
    v = {n: hp.b2 * v[n] + (1.0 - hp.b2) * delta[n] ** 2 for n in x}
    total = sum(float(t.double().sum()) for t in v.values())
    count = sum(t.numel() for t in v.values())
    v_bar = total / count
    beta1 = {}
    for n in x:
        # v̄ = 0 only when every Δ so far was 0: β1 = 0 then (m = Δ = 0 anyway).
        ratio = v[n] / v_bar if v_bar > 0.0 else torch.ones_like(v[n])
        beta1[n] = (1.0 - ratio).clamp(0.0, 1.0 - hp.adamom_eps)
    m = {n: beta1[n] * m[n] + (1.0 - beta1[n]) * delta[n] for n in x}
    return {n: x[n] + hp.eta * m[n] for n in x}, {"m": m, "v": v}
