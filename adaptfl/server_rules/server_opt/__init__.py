"""Server optimizers: a rule applied to the mean model change Δ, composed into any strategy.

Every round ends with x <- rule(x, Δ); `none` is plain averaging (x + Δ, FedAvg). Each rule is
one file here declaring its hyperparameters (with their run-config keys) and its pure update;
its moments live in the server state under `server-opt/<slot>`, so a checkpoint resumes them,
and they never cross the wire. Only floating-point model entries are optimised; integer
buffers (BatchNorm's `num_batches_tracked`) are averaged as before.

Adding one: a new file with a `@component("server_opt", "<name>")` class that implements
`rule`, plus its test; `server-opt='<name>'` then selects it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch

from adaptfl.core.domain import FINITE, Domain
from adaptfl.core.params import Component

Tensors = dict[str, torch.Tensor]
SLOT_PREFIX = "server-opt/"  # server-state key of a moment slot: "server-opt/m", "server-opt/v"


def zeros_like(tensors: Mapping[str, torch.Tensor]) -> Tensors:
    return {n: torch.zeros_like(t) for n, t in tensors.items()}


class ServerOpt(Component):
    """Base: subclasses declare `eta` (and their own keys) and implement `rule`.

    `delta_domain` is what each reply's Δ must satisfy for this rule (SQUARABLE where the rule
    squares Δ: a finite Δ of 1e30 makes Δ² infinite); `moment_domains` what its moment slots
    must hold after every round (the invariant check refuses a round that breaks them)."""

    delta_domain: ClassVar[Domain] = FINITE
    moment_domains: ClassVar[dict[str, Domain]] = {}

    def rule(self, x: Tensors, delta: Tensors, moments: dict[str, Tensors], server_round: int
             ) -> tuple[Tensors, dict[str, Tensors]]:
        raise NotImplementedError

    def step(self, x: Tensors, delta: Tensors, extras: Mapping[str, Tensors], server_round: int
             ) -> tuple[Tensors, dict[str, Tensors]]:
        """New model (all entries) and the new moment slots (as server-state extras)."""
        floats = [n for n, t in x.items() if t.is_floating_point()]
        xf = {n: x[n] for n in floats}
        df = {n: delta[n].to(x[n].dtype) for n in floats}
        moments = {k[len(SLOT_PREFIX):]: v for k, v in extras.items() if k.startswith(SLOT_PREFIX)}
        new_xf, new_moments = self.rule(xf, df, moments, server_round)
        new_x = {n: new_xf[n] if n in new_xf else x[n] + delta[n].to(x[n].dtype) for n in x}
        return new_x, {SLOT_PREFIX + k: v for k, v in new_moments.items()}
