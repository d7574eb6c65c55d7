"""Plain averaging (FedAvg, McMahan et al. 2017): x <- x + η·Δ, η = 1 by default."""

from __future__ import annotations

from dataclasses import dataclass

from adaptfl.core.params import component, param
from adaptfl.server_rules.server_opt import ServerOpt, Tensors


@component("server_opt", "none")
@dataclass(frozen=True)
class Average(ServerOpt):
    """x <- x + η·Δ: no moments."""

    eta: float = param(1.0, "server learning rate η", within=(0.0, None), open_low=True, sane=(0.0, 1e3))

    def rule(self, x: Tensors, delta: Tensors, moments: dict[str, Tensors], server_round: int
             ) -> tuple[Tensors, dict[str, Tensors]]:
        if self.eta == 1.0:  # exactly x + Δ
            return {n: x[n] + delta[n] for n in x}, {}
        return {n: x[n] + self.eta * delta[n] for n in x}, {}
