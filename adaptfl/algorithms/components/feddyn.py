"""FedDyn (Acar et al., ICLR 2021, Alg. 1).

    client: θ_i^t = argmin L_i(θ) - <∇L_i(θ_i^{t-1}), θ> + (α/2)·||θ - θ^{t-1}||², applied as a
            gradient correction every step: ∇ += α·(θ - θ^{t-1}) - ∇L_i(θ_i^{t-1});
            afterwards ∇L_i(θ_i^t) = ∇L_i(θ_i^{t-1}) - α·(θ_i^t - θ^{t-1})   (durable state)
    server: h^t = h^{t-1} - α·(|S|/N)·mean Δ_i;   θ^t = θ^{t-1} + mean Δ_i - h^t / α

h is server state (parameters only, zero at the start); nothing but the model crosses the wire.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from adaptfl.core import wire
from adaptfl.core.params import component, param
from adaptfl.core.stage import Aggregation, ClientPart, ClientRound, PartOutput, Stage

if TYPE_CHECKING:
    from adaptfl.local_update import LocalUpdate

STATE = "feddyn"
H = "feddyn-h"  # server state slot of h (never sent)


@component("term", "feddyn")
@dataclass(frozen=True)
class FedDyn(Stage):
    """The dynamic regulariser, both sides."""

    dyn_alpha: float = param(0.01, "FedDyn's α (dynamic regulariser weight)", within=(0.0, None),
                             open_low=True, sane=(0.0, 1e3))

    def start(self, ctx: ClientRound) -> ClientPart:
        return _FedDyn(ctx, self.dyn_alpha)

    def aggregate(self, agg: Aggregation) -> None:
        alpha = self.dyn_alpha
        h = agg.extras.get(H) or {n: torch.zeros_like(agg.model[n]) for n in agg.spec.parameters}
        share = len(agg.replies) / max(agg.num_nodes, len(agg.replies))  # |S| / N
        h = {n: h[n] - alpha * share * agg.mean_delta[n].to(h[n]) for n in h}
        for n in h:
            agg.model[n] = agg.model[n] - h[n] / alpha
        agg.new_extras[H] = h


class _FedDyn(ClientPart):
    def __init__(self, ctx: ClientRound, alpha: float) -> None:
        self.ctx, self.alpha = ctx, alpha
        state, self.source = ctx.store.load(STATE, {n: tuple(t.shape) for n, t in ctx.start.items()})
        self.prev_grad = {n: state[n].to(t) if state else torch.zeros_like(t) for n, t in ctx.start.items()}

    def correct_(self, params: Mapping[str, torch.nn.Parameter]) -> None:
        for n, p in params.items():
            if p.grad is not None:
                p.grad.add_(p.detach() - self.ctx.start[n], alpha=self.alpha).sub_(self.prev_grad[n])

    def finish(self, opt: LocalUpdate, delta: Mapping[str, torch.Tensor], train_loss: float) -> PartOutput:
        new = {n: g - self.alpha * delta[n].to(g) for n, g in self.prev_grad.items()}
        self.ctx.store.save(STATE, new)
        return PartOutput(metrics={wire.CLIENT_STATE: int(self.source)})
