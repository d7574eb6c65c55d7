"""The eager form of the local step: each tensor's own direction, then the chain's generic
passes over the gathered vector (the per-tensor rules, Muon and SOAP; several param groups; a
step where some parameter has no gradient), as `step/choose.py` decides. Its arithmetic is
`step/tensors.py`'s (tests/local_update/test_forms.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import torch

from adaptfl.local_update.blocks import Block
from adaptfl.local_update.rules import Preconditioner, Step
from adaptfl.local_update.workspace import Workspace


def check_fresh(rule: Preconditioner, d: torch.Tensor | None, st: dict[str, Any],
                 g: torch.Tensor) -> None:
    """Refuse a direction that shares memory with the rule's state or with g: the chain scales
    u in place (and overwrites g with the scores), so an aliased d would corrupt them."""
    if d is None:
        return
    ptr = d.untyped_storage().data_ptr()
    held = [("g", g), *((k, v) for k, v in st.items() if isinstance(v, torch.Tensor))]
    for key, t in held:
        if t.numel() and t.untyped_storage().data_ptr() == ptr:
            raise ValueError(f"local rule {rule.name!r} returned a direction aliasing its {key!r}: "
                             f"direction() must return a fresh tensor (the chain scales it in place)")


def tensor_blocks(rule: Preconditioner, active: list[torch.Tensor], state: Mapping[torch.Tensor, Any],
                  steps: set[int], lr: float, wd: float, decay: float, at: Step) -> list[Block]:
    """One block per tensor: the rule's directions tensor by tensor (or the whole group at
    once where it declares `batched_directions`), each checked fresh. `at` carries the
    round's step offset, λ and batch size; each tensor's own count is its state's `step`."""
    given = cast(list[torch.Tensor], [p.grad for p in active])  # active: the params with a grad
    grads = [gr if not (rule.coupled_decay and wd) else gr.add(p, alpha=wd)
             for p, gr in zip(active, given, strict=True)]
    if rule.batched_directions and len(steps) == 1:  # the whole group at once (Muon)
        k = steps.pop()
        directions = rule.directions(grads, [state[p] for p in active],
                                     Step(k, at.t + k, at.lam, at.bs))
    else:
        directions = [rule.direction(g, state[p], Step(state[p]["step"], at.t + state[p]["step"],
                                                       at.lam, at.bs))
                      for p, g in zip(active, grads, strict=True)]
    for p, g, direction in zip(active, grads, directions, strict=True):
        check_fresh(rule, direction[0], state[p], g)
    return [Block([p], d, g, lr * scale, decay, rule.decay_after,
                   state[p].get("global_direction"))
            for p, g, (d, scale) in zip(active, grads, directions, strict=True)]


def combine(blocks: list[Block], ref_lr: float, rho: float, work: Workspace
            ) -> tuple[torch.Tensor, torch.Tensor, float]:
    """u = (1-ρ)·(c/L)·d + ρ·Δ_G and g of several blocks (or one per tensor), gathered into one
    vector each; (u, g, 1: no factor of u left to the step)."""
    n, like = sum(p.numel() for b in blocks for p in b.params), blocks[0].params[0].detach()
    u = torch.cat([b.scaled_direction(ref_lr).reshape(-1) for b in blocks],
                  out=work.get("u", n, like))
    g = torch.cat([b.g.reshape(-1) for b in blocks], out=work.get("g", n, like))
    if rho > 0.0:  # Δ_G = 0 before the first aggregation (Algorithm 1)
        u.mul_(1.0 - rho)
        if all(b.global_direction is not None for b in blocks):
            # cast: the all() above checked every block has one
            dg = torch.cat([cast(torch.Tensor, b.global_direction).reshape(-1) for b in blocks],
                           out=work.get("dg", n, like))
            u.add_(dg, alpha=rho)
    return u, g, 1.0


def move(blocks: list[Block], u: torch.Tensor, sizes: list[int], phi: torch.Tensor | None,
          scale: float) -> None:
    """x = (1-δ)·x + scale·u (or + φ ⊙ u), per tensor with torch's foreach kernels; no decay
    on a rule's initialising step (SOAP's first one moves nothing of its own)."""
    params = [p for b in blocks for p in b.params]
    steps = [v.view_as(p) for v, p in zip(torch.split(u, sizes), params, strict=True)]
    decays = [0.0 if b.d is None else b.decay for b in blocks for _ in b.params]
    if any(decays):
        if len(set(decays)) == 1:
            torch._foreach_mul_(params, 1.0 - decays[0])
        else:
            for p, dec in zip(params, decays, strict=True):
                p.mul_(1.0 - dec)
    if phi is None:
        torch._foreach_add_(params, steps, alpha=scale)
    else:
        factors = [v.view_as(p) for v, p in zip(torch.split(phi, sizes), params, strict=True)]
        torch._foreach_addcmul_(params, steps, factors)


def move_decaying_after(blocks: list[Block], u: torch.Tensor, sizes: list[int],
                        phi: torch.Tensor | None, ref_lr: float, rho: float) -> None:
    """SOAP's order: x = (x - L·u)(1-δ), the correction's share given back undecayed."""
    params = [p for b in blocks for p in b.params]
    owners = [b for b in blocks for _ in b.params]
    steps = torch.split(u, sizes)
    factors = None if phi is None else torch.split(phi, sizes)
    for i, (b, p) in enumerate(zip(owners, params, strict=True)):
        decay = 0.0 if b.d is None else b.decay
        if not b.decay_after:
            p.mul_(1.0 - decay)
        if factors is None:
            p.add_(steps[i].view_as(p), alpha=-ref_lr)
        else:
            p.addcmul_(steps[i].view_as(p), factors[i].view_as(p))
        if b.decay_after:
            p.mul_(1.0 - decay)
            b.add_correction(-ref_lr * rho * decay, only=p)
