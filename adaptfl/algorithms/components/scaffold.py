"""SCAFFOLD, option II (Karimireddy et al., ICML 2020, Alg. 1).

    client: y <- y - lr·(∇f_i(y) - c_i + c)                 every local step
            c_i⁺ = c_i - c + (x - y) / (K·lr)               after the K steps
            upload Δy = y - x and Δc_i = c_i⁺ - c_i
    server: x <- x + η_g·mean Δy_i   (η_g and any server rule: server_rules/server_opt/)
            c <- c + (|S|/N)·mean Δc_i                      (N = connected clients)

c goes down with the model (zero until the server has one); c_i is durable client state (zero
at first participation or when lost, the paper's initialisation).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from adaptfl.core import wire
from adaptfl.core.contract import Record
from adaptfl.core.params import component
from adaptfl.core.stage import Aggregation, ClientPart, ClientRound, PartOutput, Stage

if TYPE_CHECKING:
    from adaptfl.local_update import LocalUpdate

STATE = "scaffold"


def add_to_grads_(params: Mapping[str, torch.nn.Parameter], tensors: Mapping[str, torch.Tensor],
                  scale: float = 1.0) -> None:
    """p.grad += scale·t for every parameter that has a gradient this step."""
    for n, p in params.items():
        if p.grad is not None and n in tensors:
            p.grad.add_(tensors[n], alpha=scale)


@component("term", "scaffold")
@dataclass(frozen=True)
class Scaffold(Stage):
    """Control variates c (server) and c_i (durable, per client)."""

    down = (Record(wire.SCAFFOLD_C, doc="the server control variate c"),)
    up = (Record(wire.DELTA_C, doc="Δc_i = c_i⁺ - c_i"),)

    def start(self, ctx: ClientRound) -> ClientPart:
        return _Scaffold(ctx)

    def aggregate(self, agg: Aggregation) -> None:
        mean_dc = agg.combine(wire.DELTA_C)
        c = agg.extras.get(wire.SCAFFOLD_C) or {n: torch.zeros_like(t) for n, t in mean_dc.items()}
        share = len(agg.replies) / max(agg.num_nodes, len(agg.replies))  # |S| / N
        agg.new_extras[wire.SCAFFOLD_C] = {n: c[n] + share * mean_dc[n] for n in c}


class _Scaffold(ClientPart):
    def __init__(self, ctx: ClientRound) -> None:
        self.ctx = ctx
        zeros = {n: torch.zeros_like(t) for n, t in ctx.start.items()}
        self.c = ctx.records.get(wire.SCAFFOLD_C) or zeros
        state, self.source = ctx.store.load(STATE, {n: tuple(t.shape) for n, t in ctx.start.items()})
        self.c_i = {n: state[n].to(t) for n, t in ctx.start.items()} if state else zeros
        self.correction = {n: self.c[n] - self.c_i[n] for n in ctx.start}  # c - c_i

    def correct_(self, params: Mapping[str, torch.nn.Parameter]) -> None:
        add_to_grads_(params, self.correction)

    def finish(self, opt: LocalUpdate, delta: Mapping[str, torch.Tensor], train_loss: float) -> PartOutput:
        info = self.ctx.info
        scale = 1.0 / (info.local_steps * info.lr)
        c_plus = {n: self.c_i[n] - self.c[n] - delta[n].to(self.c_i[n]) * scale
                  for n in self.c_i}  # (x - y)/(K·lr) = -Δy/(K·lr)
        self.ctx.store.save(STATE, c_plus)
        return PartOutput(records={wire.DELTA_C: {n: (c_plus[n] - self.c_i[n]).cpu() for n in c_plus}},
                          metrics={wire.CLIENT_STATE: int(self.source)})
