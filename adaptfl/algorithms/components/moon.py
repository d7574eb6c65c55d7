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
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from adaptfl.core import wire
from adaptfl.core.params import component, param
from adaptfl.core.stage import ClientPart, ClientRound, PartOutput, Stage

if TYPE_CHECKING:
    from adaptfl.local_update import LocalUpdate

STATE = "moon"


def head_of(model: torch.nn.Module) -> torch.nn.Linear:
    heads = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    if not heads:
        raise ValueError("MOON needs a model whose classifier head is an nn.Linear")
    return heads[-1]


def representation(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The input of the classifier head for batch x (no gradient), one row per example."""
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


@component("term", "moon")
@dataclass(frozen=True)
class Moon(Stage):
    """μ·ℓ_con added to the local loss; the previous local model is durable client state."""

    mu: float = param(1.0, "MOON's μ: weight of the contrastive loss", within=(0.0, None),
                      sane=(0.0, 1e4))
    moon_tau: float = param(0.5, "MOON's temperature τ", within=(0.0, None), open_low=True)

    def start(self, ctx: ClientRound) -> ClientPart:
        return _Moon(ctx, self.mu, self.moon_tau)


class _Moon(ClientPart):
    def __init__(self, ctx: ClientRound, mu: float, tau: float) -> None:
        self.ctx, self.mu, self.tau = ctx, mu, tau
        self.global_model = copy.deepcopy(ctx.model).eval()
        self.prev_model = copy.deepcopy(ctx.model).eval()
        shapes = {n: tuple(t.shape) for n, t in ctx.model.state_dict().items()}
        state, self.source = ctx.store.load(STATE, shapes)
        if state is not None:
            self.prev_model.load_state_dict(state)
        self._z: list[torch.Tensor] = []
        self._hook = head_of(ctx.model).register_forward_hook(lambda m, inp, out: self._z.append(inp[0]))

    def loss(self, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor | None:
        z = self._z.pop().flatten(1)
        self._z.clear()
        return self.mu * contrastive_loss(z, representation(self.global_model, x),
                                          representation(self.prev_model, x), self.tau)

    def finish(self, opt: LocalUpdate, delta: Mapping[str, torch.Tensor], train_loss: float) -> PartOutput:
        self._hook.remove()
        self.ctx.store.save(STATE, dict(self.ctx.model.state_dict()))
        return PartOutput(metrics={wire.CLIENT_STATE: int(self.source)})
