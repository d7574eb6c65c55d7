"""MOON's model-contrastive term (Li, He & Song, CVPR 2021, Eq. 3-4):

    ℓ_con = -log( e^{sim(z, z_glob)/τ} / (e^{sim(z, z_glob)/τ} + e^{sim(z, z_prev)/τ}) )
    ℓ = ℓ_sup + μ·ℓ_con

z is the representation of the batch under the local model being trained, z_glob under the
round's global model, z_prev under this client's model from its previous participation (durable
state; the global model when there is none, as MOON's code initialises it); sim is the cosine.
The representation is the input of the model's last `nn.Linear` (the classifier head).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from adaptfl.algorithms import wire
from adaptfl.client_app.terms import LocalTerm, RoundInputs, TermOutput

STATE = "moon"


def head_of(model: torch.nn.Module) -> torch.nn.Linear:
    heads = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    if not heads:
        raise ValueError("MOON needs a model whose classifier head is an nn.Linear")
    return heads[-1]


def representation(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The input of the classifier head for batch x (no gradient)."""
    captured: list[torch.Tensor] = []
    hook = head_of(model).register_forward_hook(lambda m, inp, out: captured.append(inp[0]))
    try:
        with torch.no_grad():
            model(x)
    finally:
        hook.remove()
    return captured[0].flatten(1)


def contrastive_loss(z: torch.Tensor, z_glob: torch.Tensor, z_prev: torch.Tensor,
                     tau: float) -> torch.Tensor:
    logits = torch.stack([F.cosine_similarity(z, z_glob, dim=1),
                          F.cosine_similarity(z, z_prev, dim=1)], dim=1) / tau
    return F.cross_entropy(logits, torch.zeros(len(z), dtype=torch.long, device=z.device))


class MoonTerm(LocalTerm):
    def __init__(self, inputs: RoundInputs) -> None:
        recipe = inputs.recipe
        if recipe.mu < 0.0 or not recipe.moon_tau > 0.0:
            raise ValueError(f"invalid mu={recipe.mu} or moon-tau={recipe.moon_tau}: need μ >= 0, τ > 0")
        self.inputs, self.mu, self.tau = inputs, recipe.mu, recipe.moon_tau
        self.global_model = copy.deepcopy(inputs.model).eval()
        self.prev_model = copy.deepcopy(inputs.model).eval()
        state, self.source = inputs.store.load(STATE)
        if state is not None:
            self.prev_model.load_state_dict(state)
        self._z: list[torch.Tensor] = []
        self._hook = head_of(inputs.model).register_forward_hook(
            lambda m, inp, out: self._z.append(inp[0]))

    def loss(self, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor | None:
        z = self._z.pop().flatten(1)
        self._z.clear()
        z_glob = representation(self.global_model, x)
        z_prev = representation(self.prev_model, x)
        return self.mu * contrastive_loss(z, z_glob, z_prev, self.tau)

    def finish(self, delta: Mapping[str, torch.Tensor], train_loss: float) -> TermOutput:
        self._hook.remove()
        self.inputs.store.save(STATE, dict(self.inputs.model.state_dict()))
        return TermOutput(metrics={wire.CLIENT_STATE: int(self.source)})
