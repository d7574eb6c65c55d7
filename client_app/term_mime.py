"""MimeLite's client side (Karimireddy et al., "Breaking the centralized barrier…", 2021, Alg. 2).

Local steps use the server's momentum m, frozen for the round, as a momentum-SGD base optimizer:

    u = (1-β)·∇f_i(y; ξ) + β·m,   y <- y - lr·u

which is the local update chain's correction with ρ = β and Δ_G = m (the server sends m as
`delta-g`). This term adds the other half: the full-batch local gradient at the global model,
∇f_i(x^r) over the client's whole partition, uploaded so the server can update
m <- (1-β)·mean_i ∇f_i(x^r) + β·m.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from adaptfl.algorithms import wire
from adaptfl.client_app.terms import LocalTerm, RoundInputs, TermOutput

CHUNK = 512  # examples per forward pass of the full-batch gradient


def full_gradient(model: torch.nn.Module, inputs: RoundInputs) -> dict[str, torch.Tensor]:
    """∇f_i(x) = mean loss gradient over the partition, in chunks (no randomness used)."""
    device = next(model.parameters()).device
    params = dict(model.named_parameters())
    total = {n: torch.zeros_like(p) for n, p in params.items()}
    n_total = len(inputs.indices)
    for chunk in inputs.indices.split(CHUNK):
        x, y = inputs.data.batch(chunk)
        loss = F.cross_entropy(model(x.to(device)), y.to(device), reduction="sum") / n_total
        grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
        for (n, _), g in zip(params.items(), grads, strict=True):
            if g is not None:
                total[n].add_(g)
    return total


class GradAtXTerm(LocalTerm):
    def __init__(self, inputs: RoundInputs) -> None:
        inputs.model.train()
        self.grad_at_x = {n: g.cpu() for n, g in full_gradient(inputs.model, inputs).items()}

    def finish(self, delta: Mapping[str, torch.Tensor], train_loss: float) -> TermOutput:
        return TermOutput(records={wire.GRAD_AT_X: self.grad_at_x})
