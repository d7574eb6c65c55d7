"""FedAdam: Adam on the server over the pseudo-gradient Δ (Reddi et al. 2021, Alg. 2).

    m = β1·m + (1-β1)·Δ
    v = β2·v + (1-β2)·Δ²
    x = x + η_r · m / (sqrt(v) + τ),   η_r = η·sqrt(1-β2^(r+1)) / (1-β1^(r+1))

The bias-corrected η_r on `r+1` (r = server round) is Flower's `FedAdam` convention, kept so the
same replies give the same model as Flower's strategy (tests/server_rules/test_server_opt.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from adaptfl.core.domain import NONNEG, SQUARABLE
from adaptfl.core.params import component, param
from adaptfl.server_rules.server_opt import ServerOpt, Tensors, zeros_like

UNIT = (0.0, 1.0)


def first_moment(delta: Tensors, moments: dict[str, Tensors], beta1: float) -> Tensors:
    """m = β1·m + (1-β1)·Δ (FedOpt's shared stage)."""
    m = moments.get("m") or zeros_like(delta)
    return {n: beta1 * m[n] + (1.0 - beta1) * delta[n] for n in delta}


@component("server_opt", "adam")
@dataclass(frozen=True)
class ServerAdam(ServerOpt):
    delta_domain = SQUARABLE  # the rule squares Δ
    moment_domains = {"v": NONNEG}
    # Reddi et al.'s typical best order for the 1/sqrt(v) rules (Flower's default is 0.1)
    eta: float = param(0.01, "server learning rate η", within=(0.0, None), open_low=True, sane=(0.0, 1e3))
    server_beta1: float = param(0.9, "FedAdam / FedYogi β1 (Flower: beta_1)", within=UNIT, open_high=True)
    server_beta2: float = param(0.99, "FedAdam / FedYogi β2 (Flower: beta_2)", within=UNIT, open_high=True)
    server_tau: float = param(1e-3, "adaptivity τ of Reddi et al. (Flower: tau)", within=(0.0, None),
                              open_low=True)

    def rule(self, x: Tensors, delta: Tensors, moments: dict[str, Tensors], server_round: int
             ) -> tuple[Tensors, dict[str, Tensors]]:
        b1, b2 = self.server_beta1, self.server_beta2
        m = first_moment(delta, moments, b1)
        v = moments.get("v") or zeros_like(x)
        v = {n: b2 * v[n] + (1.0 - b2) * delta[n] ** 2 for n in x}
        eta_r = self.eta * math.sqrt(1.0 - b2 ** (server_round + 1)) / (1.0 - b1 ** (server_round + 1))
        return {n: x[n] + eta_r * m[n] / (v[n].sqrt() + self.server_tau) for n in x}, {"m": m, "v": v}
