"""The step of the per-tensor rules (Muon, SOAP) as the papers write it, for one client, out of
place: what `LocalUpdate`'s per-tensor blocks must compute (tests/local_update/test_forms.py).

FedPAC (seed 001, Algorithm 1; its pairing is Muon and SOAP), without trust modulation:

    x = LocalOpt.step(x, g)  at lr_loc = (1-ρ)·lr, its decoupled decay too
    x = x - ρ·L·Δ_G                                      the global preconditioned direction

the local optimizer's step in its authors' order (SOAP: x = (x - c·d)·(1-δ), decay after the
move; Muon: x = (1-δ)·x - c·d). With a trust rule the chain is FedACT's over the tensors:

    u = (1-ρ)·(c/L)·d + ρ·Δ_G;  φ = trust(u ⊙ g);  x = (1-δ)·x - L·φ ⊙ u

(SOAP's decay after the move, the correction's share left undecayed). FedMIX-P (seed 002, the
operator H = (1-λ)·P^r + λ·P_i applied to this gradient) is `mixed`, which SOAP applies to its
Kronecker statistics before deriving its eigenbasis and Sophia to its Hessian.
"""

from __future__ import annotations

from typing import Any

import torch

from adaptfl.local_update.rules import Direction, Preconditioner, Step
from adaptfl.local_update.step.reference import Chain, modulate

TensorState = dict[str, Any]  # one tensor's state: its slots and counters (SOAP's adam_step)


def mixed(reference: torch.Tensor, own: torch.Tensor, lam: float) -> torch.Tensor:
    """FedMIX-P's statistic of this step: (1-λ)·P^r + λ·P_i (λ = 1: the client's own)."""
    return own if lam == 1.0 else (1.0 - lam) * reference + lam * own


def _copy(st: TensorState) -> TensorState:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in st.items()}


def _directions(rule: Preconditioner, gs: list[torch.Tensor], states: list[TensorState],
                at: Step) -> list[Direction]:
    """The rule's own direction of each tensor (Muon's NS5 for the whole group at once)."""
    if rule.batched_directions:
        return list(rule.directions(gs, states, at))
    return [rule.direction(g, st, at) for g, st in zip(gs, states, strict=True)]


def tensor_step(rule: Preconditioner, xs: list[torch.Tensor], gs: list[torch.Tensor],
                states: list[TensorState], at: Step, chain: Chain,
                global_direction: list[torch.Tensor] | None = None
                ) -> tuple[list[torch.Tensor], list[TensorState]]:
    """(x', state') of one step of a per-tensor rule over one client's tensors; nothing given
    is written (the rule's in-place state updates land on copies)."""
    states = [_copy(st) for st in states]
    dirs = _directions(rule, gs, states, at)
    dg = global_direction if global_direction is not None and chain.rho else None
    if not chain.trust.active:
        return _own_steps(rule, xs, dirs, chain, dg), states
    return _trusted_steps(rule, xs, gs, dirs, chain, dg), states


def _decay(chain: Chain) -> float:
    """δ = lr·wd, times (1-ρ) when the local optimizer runs at lr·(1-ρ) (FedPAC's)."""
    return chain.lr * chain.weight_decay * (1.0 - chain.rho if chain.correction == "after-step" else 1.0)


def _own_steps(rule: Preconditioner, xs: list[torch.Tensor], dirs: list[Direction], chain: Chain,
               dg: list[torch.Tensor] | None) -> list[torch.Tensor]:
    """The rule's own step at (1-ρ) of its lr, in its authors' order, then x -= ρ·L·Δ_G."""
    decay, out = _decay(chain), []
    for i, (x, (d, scale)) in enumerate(zip(xs, dirs, strict=True)):
        if d is not None:
            step = (chain.lr * scale * (1.0 - chain.rho)) * d
            x = (x - step) * (1.0 - decay) if rule.decay_after else x * (1.0 - decay) - step
        out.append(x if dg is None else x - chain.ref_lr * chain.rho * dg[i])
    return out


def _trusted_steps(rule: Preconditioner, xs: list[torch.Tensor], gs: list[torch.Tensor],
                   dirs: list[Direction], chain: Chain, dg: list[torch.Tensor] | None
                   ) -> list[torch.Tensor]:
    """u = (1-ρ)·(c/L)·d + ρ·Δ_G, φ from the scores u ⊙ g over all tensors, then the move."""
    us = []
    for i, (g, (d, scale)) in enumerate(zip(gs, dirs, strict=True)):
        u = torch.zeros_like(g) if d is None else (1.0 - chain.rho) * (chain.lr * scale / chain.ref_lr) * d
        us.append(u if dg is None else u + chain.rho * dg[i])
    flat_u = torch.cat([u.reshape(-1) for u in us])[None]
    phi = modulate(flat_u * torch.cat([g.reshape(-1) for g in gs])[None], chain)
    steps = torch.split((flat_u if phi is None else phi * flat_u)[0], [x.numel() for x in xs])
    decay, out = _decay(chain), []
    for i, (x, s, (d, _)) in enumerate(zip(xs, steps, dirs, strict=True)):
        delta = 0.0 if d is None else decay
        if not rule.decay_after:
            out.append(x * (1.0 - delta) - chain.ref_lr * s.view_as(x))
            continue
        x = (x - chain.ref_lr * s.view_as(x)) * (1.0 - delta)  # decayed with x, the correction's
        out.append(x if dg is None else x - chain.ref_lr * chain.rho * delta * dg[i])  # share back
    return out
