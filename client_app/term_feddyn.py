"""FedDyn's dynamic regulariser, client side (Acar et al., ICLR 2021, Alg. 1):

    θ_i^t = argmin_θ  L_i(θ) - <∇L_i(θ_i^{t-1}), θ> + (α/2)·||θ - θ^{t-1}||²
    ∇L_i(θ_i^t) = ∇L_i(θ_i^{t-1}) - α·(θ_i^t - θ^{t-1})       (first-order condition)

Applied as a gradient correction every step: ∇ += α·(θ - θ^{t-1}) - ∇L_i(θ_i^{t-1}). The previous
local gradient ∇L_i(θ_i^{t-1}) is durable client state (zero at first participation or when lost).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from adaptfl.algorithms import wire
from adaptfl.client_app.terms import LocalTerm, RoundInputs, TermOutput

STATE = "feddyn"


class FedDynTerm(LocalTerm):
    def __init__(self, inputs: RoundInputs) -> None:
        if not inputs.recipe.dyn_alpha > 0.0:
            raise ValueError(f"invalid dyn-alpha={inputs.recipe.dyn_alpha}: must be > 0")
        self.inputs, self.alpha = inputs, inputs.recipe.dyn_alpha
        state, self.source = inputs.store.load(STATE)
        self.prev_grad = {n: state[n].to(t) if state else torch.zeros_like(t)
                          for n, t in inputs.start.items()}

    def correct_(self, params: Mapping[str, torch.nn.Parameter]) -> None:
        for n, p in params.items():
            if p.grad is not None:
                p.grad.add_(p.detach() - self.inputs.start[n], alpha=self.alpha).sub_(self.prev_grad[n])

    def finish(self, delta: Mapping[str, torch.Tensor], train_loss: float) -> TermOutput:
        new = {n: g - self.alpha * delta[n].to(g) for n, g in self.prev_grad.items()}
        self.inputs.store.save(STATE, new)
        return TermOutput(metrics={wire.CLIENT_STATE: int(self.source)})
