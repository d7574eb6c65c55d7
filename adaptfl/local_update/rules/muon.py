"""Muon as a pure per-matrix rule (Jordan et al. 2024, `torch.optim.Muon`).

    M = β·M + (1-β)·g                     momentum (in place)
    M̃ = (1-λ)·M^r + λ·M                   FedMIX-P (seed 002): mix before the Nesterov blend
    U = (1-β)·g + β·M̃                     Nesterov
    O = NS5(U)·sqrt(max(1, rows/cols))    orthogonalised, conv weights as [out, -1]

Only the matrices `routing.py` picks go to Muon; the rest form a second param group run by AdamW
with its own keys (muon-adam-lr, muon-adam-beta1/2, muon-adam-eps), as the authors do.
NS5 runs in bfloat16, as `torch.optim.Muon` and the authors' code do: the iteration only needs
singular values near 1, and bf16 halves its memory traffic.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from adaptfl.core.params import component, param
from adaptfl.local_update.routing import ROUTINGS, route_muon
from adaptfl.local_update.rules import Direction, Preconditioner, Step, group_values
from adaptfl.local_update.rules.adam import AdamW

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def newton_schulz5(g: torch.Tensor, steps: int = 5, eps: float = 1e-7,
                   dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """≈ U·Vᵀ of the matrix `g` [m, n], or of each matrix of a batch [b, m, n] (singular values
    pushed into ~[0.5, 1.5]), in `g`'s dtype."""
    if g.ndim not in (2, 3):
        raise ValueError(f"Newton-Schulz needs a matrix or a batch of them, got shape {tuple(g.shape)}")
    a, b, c = NS_COEFFICIENTS
    x = g.to(dtype)
    tall = g.size(-2) > g.size(-1)
    if tall:  # iterate on the wide side: the Gram matrix x·xᵀ is the smaller one
        x = x.mT
    # spectral norm ≤ Frobenius norm ≤ 1
    x = x / (x.norm() if x.ndim == 2 else x.norm(dim=(-2, -1), keepdim=True)).clamp(min=eps)
    mm = torch.addmm if x.ndim == 2 else torch.baddbmm
    for _ in range(steps):
        gram = x @ x.mT
        poly = mm(gram, gram, gram, beta=b, alpha=c)  # b·A + c·A²
        x = mm(x, poly, x, beta=a)  # a·X + (b·A + c·A²)·X
    return (x.mT if tall else x).to(g.dtype)


def shape_scale(shape: Sequence[int]) -> float:
    """sqrt(max(1, rows/cols)) of the [out, -1] view: equal RMS step for tall and wide matrices."""
    return math.sqrt(max(1.0, shape[0] / math.prod(shape[1:])))


def _momentum_update(g: torch.Tensor, momentum_buffer: torch.Tensor, beta: float,
                     reference: torch.Tensor | None, lam: float) -> torch.Tensor:
    """U = (1-β)·g + β·M̃ as [out, -1]; updates `momentum_buffer` in place."""
    momentum_buffer.lerp_(g, 1.0 - beta)
    mixed = momentum_buffer if reference is None or lam == 1.0 else \
        torch.lerp(reference, momentum_buffer, lam)  # (1-λ)·M^r + λ·M
    return g.lerp(mixed, beta).reshape(g.shape[0], -1)  # (1-β)·g + β·M̃


def muon_direction(g: torch.Tensor, momentum_buffer: torch.Tensor, beta: float,
                   reference: torch.Tensor | None = None, lam: float = 1.0) -> torch.Tensor:
    """O for this step (without the shape scale); updates `momentum_buffer` in place."""
    return newton_schulz5(_momentum_update(g, momentum_buffer, beta, reference, lam)).reshape(g.shape)


def muon_directions(gs: Sequence[torch.Tensor], buffers: Sequence[torch.Tensor], beta: float,
                    references: Sequence[torch.Tensor | None], lam: float) -> list[torch.Tensor]:
    """`muon_direction` of many matrices, with one batched Newton-Schulz per shape (as the
    authors' distributed code batches them): a ViT's 12 blocks are 4 batches, not 48 calls."""
    updates = [_momentum_update(g, m, beta, r, lam) for g, m, r in zip(gs, buffers, references, strict=True)]
    by_shape: dict[tuple[int, ...], list[int]] = {}
    for i, u in enumerate(updates):
        by_shape.setdefault(tuple(u.shape), []).append(i)
    out: list[torch.Tensor] = [torch.empty(0)] * len(gs)
    for members in by_shape.values():
        if len(members) == 1:
            out[members[0]] = newton_schulz5(updates[members[0]])
            continue
        for i, o in zip(members, newton_schulz5(torch.stack([updates[i] for i in members])), strict=True):
            out[i] = o
    return [o.reshape(g.shape) for o, g in zip(out, gs, strict=True)]


@component("preconditioner", "muon")
@dataclass(frozen=True)
class Muon(Preconditioner):
    """Muon on the hidden matrices, AdamW on the rest (its own keys)."""

    muon_momentum: float = param(0.95, "Muon's momentum β", within=(0.0, 1.0), open_high=True)
    muon_routing: str = param("hidden", "which matrices Muon takes: hidden (the authors') or all-2d "
                              "(FedPAC's code)", choices=ROUTINGS)
    muon_adam_lr: float = param(3e-4, "AdamW lr of the parameters Muon does not take (scheduled as lr)",
                                within=(0.0, None), open_low=True, sane=(0.0, 10.0))
    muon_adam_beta1: float = param(0.9, "β1 of Muon's AdamW half", within=(0.0, 1.0), open_high=True)
    muon_adam_beta2: float = param(0.95, "β2 of Muon's AdamW half", within=(0.0, 1.0), open_high=True)
    muon_adam_eps: float = param(1e-10, "ε of Muon's AdamW half", within=(0.0, None), open_low=True)
    trust_on_muon: bool = param(False, "opt in to per-coordinate trust modulation of Muon's "
                                "orthogonalised update (it breaks the orthogonality)")

    torch_names = {"momentum": ("muon_momentum",)}  # torch.optim.Muon's
    default_lr = 0.02
    default_weight_decay = 0.01
    elementwise = False
    routes_parameters = True  # the non-matrix parameters go to its AdamW half (`groups`)
    batched_directions = True  # batched Newton-Schulz per shape (`directions`)
    slots = ("momentum_buffer",)
    theta_slots = ("momentum_buffer",)
    shareable = True

    def direction(self, g: torch.Tensor, st: dict[str, Any], step: Step) -> Direction:
        o = muon_direction(g, st["momentum_buffer"], self.muon_momentum,
                           st.get("ref_momentum_buffer"), step.lam)
        return Direction(o.to(g.dtype), shape_scale(g.shape))

    def directions(self, gs: Sequence[torch.Tensor], sts: Sequence[dict[str, Any]], step: Step
                   ) -> list[Direction]:
        """All of the group's matrices at once (batched Newton-Schulz per shape)."""
        os = muon_directions(gs, [st["momentum_buffer"] for st in sts], self.muon_momentum,
                             [st.get("ref_momentum_buffer") for st in sts], step.lam)
        return [Direction(o.to(g.dtype), shape_scale(g.shape)) for o, g in zip(os, gs, strict=True)]

    def adam_half(self) -> AdamW:
        return AdamW(beta1=self.muon_adam_beta1, beta2=self.muon_adam_beta2, eps=self.muon_adam_eps,
                     bias_correction="local")

    def groups(self, named: Sequence[tuple[str, torch.Tensor]], lr_scale: float
               ) -> list[dict[str, Any]]:
        chosen = set(route_muon([(n, tuple(p.shape)) for n, p in named], self.muon_routing))
        muon = [(n, p) for n, p in named if n in chosen]
        rest = [(n, p) for n, p in named if n not in chosen]
        groups = [{"params": muon, **group_values(self)}] if muon else []
        if rest:  # same schedule as lr: muon-adam-lr × this round's lr factor
            groups.append({"params": rest, "lr": self.muon_adam_lr * lr_scale,
                           **group_values(self.adam_half())})
        return groups

    def theta_spec(self, params: Sequence[tuple[str, tuple[int, ...]]]) -> dict[str, tuple[int, ...]]:
        chosen = set(route_muon(params, self.muon_routing))  # the AdamW half shares nothing
        return {f"{n}/momentum_buffer": tuple(s) for n, s in params if n in chosen}
