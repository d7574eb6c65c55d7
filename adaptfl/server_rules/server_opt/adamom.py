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

from dataclasses import dataclass

import torch

from adaptfl.core.domain import NONNEG, SQUARABLE
from adaptfl.core.params import component, param
from adaptfl.server_rules.server_opt import ServerOpt, Tensors, zeros_like


@component("server_opt", "adamom")
@dataclass(frozen=True)
class Adamom(ServerOpt):
    delta_domain = SQUARABLE  # the rule squares Δ
    moment_domains = {"v": NONNEG}
    eta: float = param(1.0, "server learning rate η", within=(0.0, None), open_low=True, sane=(0.0, 1e3))
    b2: float = param(0.05, "FedAdamom: weight of the OLD v in v = b2·v + (1-b2)·Δ² (seed 004)",
                      within=(0.0, 1.0), open_high=True)
    adamom_eps: float = param(1e-3, "FedAdamom: β1 = clip(1 - v/v̄, 0, 1-ε)", within=(0.0, 1.0),
                              open_low=True, open_high=True)

    def rule(self, x: Tensors, delta: Tensors, moments: dict[str, Tensors], server_round: int
             ) -> tuple[Tensors, dict[str, Tensors]]:
        v = moments.get("v") or zeros_like(x)
        m = moments.get("m") or zeros_like(x)
        v = {n: self.b2 * v[n] + (1.0 - self.b2) * delta[n] ** 2 for n in x}
        total = sum(float(t.double().sum()) for t in v.values())
        v_bar = total / sum(t.numel() for t in v.values())
        beta1 = {}
        for n in x:
            # v̄ = 0 only when every Δ so far was 0: β1 = 0 then (m = Δ = 0 anyway).
            ratio = v[n] / v_bar if v_bar > 0.0 else torch.ones_like(v[n])
            beta1[n] = (1.0 - ratio).clamp(0.0, 1.0 - self.adamom_eps)
        m = {n: beta1[n] * m[n] + (1.0 - beta1[n]) * delta[n] for n in x}
        return {n: x[n] + self.eta * m[n] for n in x}, {"m": m, "v": v}
