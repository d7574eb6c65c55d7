"""MimeLite (Karimireddy et al., "Breaking the centralized barrier…", 2021, Alg. 2) with a
momentum-SGD base optimizer.

    client: u = (1-β)·∇f_i(y; ξ) + β·m, y <- y - lr·u    m: the server's momentum, frozen for the
            round (the chain's correction with ρ = β and Δ_G = m)
            uploads ∇f_i(x^r): the full-batch gradient of the task loss at the global model
    server: x <- x + mean Δ_i;  m <- (1-β)·mean ∇f_i(x^r) + β·m

m goes down every round (zeros in round 1, the paper's initial state).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from adaptfl.algorithms import wire
from adaptfl.algorithms.components.correction import Correction
from adaptfl.algorithms.contract import ModelSpec, Record
from adaptfl.algorithms.params import component, param
from adaptfl.algorithms.stage import Aggregation, ClientPart, ClientRound, PartOutput

MOMENTUM = "m"  # the record and the server state slot of m


def full_gradient(model: torch.nn.Module, ctx: ClientRound) -> dict[str, torch.Tensor]:
    """∇f_i(x) = mean loss gradient over the whole partition (no randomness used)."""
    data = ctx.data
    if data.full_batches is None or data.loss is None:
        raise ValueError("MimeLite needs the client's data for ∇f_i(x): pass data=ClientData(...)")
    device = next(model.parameters()).device
    params = ctx.params
    total = {n: torch.zeros_like(p) for n, p in params.items()}
    count = 0
    for x, y in data.full_batches():
        # the task's own loss (one per prediction: images and tokens alike), weighted by the
        # chunk's predictions so the sum is the gradient of the partition's mean loss
        loss = data.loss(model(x.to(device)), y.to(device))
        grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
        for (n, _), g in zip(params.items(), grads, strict=True):
            if g is not None:
                total[n].add_(g, alpha=y.numel())
        count += y.numel()
    return {n: t / max(count, 1) for n, t in total.items()}


@component("correction", "mimelite")
@dataclass(frozen=True)
class MimeLite(Correction):
    """Server momentum applied on the clients; full-batch gradients at x^r uploaded."""

    beta1: float = param(0.9, "MimeLite's momentum β: u = (1-β)·g + β·m", within=(0.0, 1.0),
                         open_high=True)
    record = MOMENTUM

    @property
    def weight(self) -> float:
        return self.beta1

    def records_down(self) -> tuple[Record, ...]:
        return (Record(MOMENTUM, doc="the server momentum m"),)

    def records_up(self) -> tuple[Record, ...]:
        return (Record(wire.GRAD_AT_X, doc="∇f_i(x^r) over the partition"),)

    def payload(self, extras: Mapping[str, dict], spec: ModelSpec, algorithm: Any) -> dict:
        m = extras.get(MOMENTUM) or {n: torch.zeros(s, dtype=d) for n, (s, d) in spec.params().items()}
        return {MOMENTUM: m}

    def start(self, ctx: ClientRound) -> ClientPart:
        ctx.model.train()
        return _Mime(ctx.records.get(MOMENTUM), full_gradient(ctx.model, ctx))

    def aggregate(self, agg: Aggregation) -> None:
        grad = agg.combine(wire.GRAD_AT_X)
        m = agg.extras.get(MOMENTUM) or {n: torch.zeros_like(g) for n, g in grad.items()}
        agg.new_extras[MOMENTUM] = {n: (1.0 - self.beta1) * grad[n] + self.beta1 * m[n] for n in grad}


class _Mime(ClientPart):
    def __init__(self, m: dict | None, grad_at_x: dict[str, torch.Tensor]) -> None:
        self.m, self.grad_at_x = m, {n: g.cpu() for n, g in grad_at_x.items()}

    def configure(self, opt: Any) -> None:
        if self.m is not None:
            opt.set_global_direction(self.m)

    def finish(self, opt: Any, delta: Mapping[str, torch.Tensor], train_loss: float) -> PartOutput:
        return PartOutput(records={wire.GRAD_AT_X: self.grad_at_x})
