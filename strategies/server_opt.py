"""Server optimizers: a rule applied to the mean model change Δ, composed into any strategy.

Every strategy ends its round with `x <- ServerOptimizer.step(x, Δ)`; `none` is plain averaging
(x + Δ, FedAvg). The rules (FedAvgM, FedAdam, FedYogi, FedAdagrad, FedAdamom) are pure functions
in their own files; their moments live in `ServerState.extras` under `server-opt/<slot>` so a
checkpoint of the state resumes them, and they never cross the wire.

Only floating-point model entries are optimised; integer buffers (e.g. BatchNorm's
`num_batches_tracked`) are averaged as before.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from adaptfl.strategies.state import Tensors

SLOT_PREFIX = "server-opt/"  # extras key of a moment slot: "server-opt/m", "server-opt/v"

# (x, Δ, moments by slot, server round, hyperparameters) -> (new x, new moments)
Rule = Callable[[Tensors, Tensors, dict[str, Tensors], int, "ServerHyper"],
                tuple[Tensors, dict[str, Tensors]]]


@dataclass(frozen=True)
class ServerHyper:
    """Server-side hyperparameters, named as in the papers / Flower's strategies."""

    eta: float = 1.0  # server learning rate η
    server_momentum: float = 0.9  # FedAvgM's momentum (Flower: server_momentum)
    server_beta1: float = 0.9  # FedAdam / FedYogi β1 (Flower: beta_1)
    server_beta2: float = 0.99  # FedAdam / FedYogi β2 (Flower: beta_2)
    server_tau: float = 1e-3  # adaptivity τ of Reddi et al. (Flower: tau)
    b2: float = 0.05  # FedAdamom: weight of the OLD v (seed 004)
    adamom_eps: float = 1e-3  # FedAdamom: β1 is clipped to [0, 1-ε]

    def __post_init__(self) -> None:
        if not self.eta > 0.0:
            raise ValueError(f"invalid eta={self.eta}: the server learning rate must be > 0")
        for name in ("server_momentum", "server_beta1", "server_beta2", "b2"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"invalid {name.replace('_', '-')}={value}: must be in [0, 1)")
        if not self.server_tau > 0.0:
            raise ValueError(f"invalid server-tau={self.server_tau}: must be > 0")
        if not 0.0 < self.adamom_eps < 1.0:
            raise ValueError(f"invalid adamom-eps={self.adamom_eps}: must be in (0, 1)")


def zeros_like(tensors: Tensors) -> Tensors:
    return {n: torch.zeros_like(t) for n, t in tensors.items()}


def average_rule(x: Tensors, delta: Tensors, moments: dict[str, Tensors], server_round: int,
                 hp: ServerHyper) -> tuple[Tensors, dict[str, Tensors]]:
    """x <- x + Δ (FedAvg): no moments."""
    return {n: x[n] + delta[n] for n in x}, {}


def _rules() -> dict[str, Rule]:
    from adaptfl.strategies.fedadagrad import fedadagrad_rule
    from adaptfl.strategies.fedadam import fedadam_rule
    from adaptfl.strategies.fedadamom import fedadamom_rule
    from adaptfl.strategies.fedavgm import fedavgm_rule
    from adaptfl.strategies.fedyogi import fedyogi_rule

    return {"none": average_rule, "avgm": fedavgm_rule, "adam": fedadam_rule,
            "yogi": fedyogi_rule, "adagrad": fedadagrad_rule, "adamom": fedadamom_rule}


SERVER_OPTS = ("none", "avgm", "adam", "yogi", "adagrad", "adamom")


class ServerOptimizer:
    """Applies one rule to the floating entries of the model; keeps its moments in extras."""

    def __init__(self, name: str, hp: ServerHyper) -> None:
        rules = _rules()
        if name not in rules:
            raise ValueError(f"unknown server-opt={name!r}; choose one of {sorted(rules)}")
        self.name, self.hp, self.rule = name, hp, rules[name]

    def step(self, x: Tensors, delta: Tensors, extras: Mapping[str, Tensors],
             server_round: int) -> tuple[Tensors, dict[str, Tensors]]:
        """New model (all entries) and the new moment slots (as extras entries)."""
        floats = [n for n, t in x.items() if t.is_floating_point()]
        xf = {n: x[n] for n in floats}
        df = {n: delta[n].to(x[n].dtype) for n in floats}
        moments = {k[len(SLOT_PREFIX):]: v for k, v in extras.items() if k.startswith(SLOT_PREFIX)}
        new_xf, new_moments = self.rule(xf, df, moments, server_round, self.hp)
        new_x = {n: new_xf[n] if n in new_xf else x[n] + delta[n].to(x[n].dtype) for n in x}
        return new_x, {SLOT_PREFIX + k: v for k, v in new_moments.items()}
