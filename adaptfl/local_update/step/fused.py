"""The fused form of the local step: torch's kernels over one flat vector per param group.

The fast passes of AdamW's and SGD's directions, kept out of the rules, which stay pure
(`rules/`: a fresh d from g and the state), and the trust rules' φ (trust.py's radix / band
top-k). On the one-vector path of a single param group (`local_step._flat_block`, when
`step/choose.py` says so) a rule listed here, by its exact class, may:

- write its direction into the chain's workspace instead of a fresh tensor;
- read the gradients where backward left them, per tensor (torch's fused AdamW kernel, as
  `AdamW(fused=True)` runs it), so the chain copies them into g only where it reads g;
- carry the correction in its last pass: u = ρ·Δ_G + (1-ρ)·(lr/L)·d, flagged `corrected`;
- leave that pass to the trust step (`pending`), which may do the same work in its own first
  pass (FedACT's native loops, step/native.py).

A subclass that changes `direction` is not listed, so it runs through its own `direction` and the
chain does the rest: a new rule cannot inherit a fast path that computes something else.
tests/local_update/test_rule_purity.py runs each rule through every path it is eligible for.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from adaptfl.local_update.modulation import Trust, _Ranked
from adaptfl.local_update.rules import Direction, Preconditioner, Step
from adaptfl.local_update.rules.adam import Adam, AdamW, bias_steps
from adaptfl.local_update.rules.sgd import SGD
from adaptfl.local_update.step.fused_adam import FusedAdamPass, adam_direction_
from adaptfl.local_update.trust import phi_ as trust_phi_
from adaptfl.local_update.workspace import Workspace


@dataclass
class Fusion:
    """What the flat path offers a listed rule."""

    out: torch.Tensor  # the workspace the direction may be written to
    mix: float = 1.0  # weight of the local direction when the correction is fused: (1-ρ)·lr/L
    addend: torch.Tensor | None = None  # ρ·Δ_G to fuse in (None: the chain corrects)
    defer: bool = False  # the last pass may be left to the trust step
    # the gradients where backward left them, g not filled (`reads_in_place` rules only), and
    # per-tensor views of `out` and of the state slots ("out", "exp_avg", ...)
    grads: list[torch.Tensor] | None = None
    views: dict[str, list[torch.Tensor]] | None = None


class Fused(NamedTuple):
    """A direction as the flat path took it."""

    d: torch.Tensor | None
    scale: float = 1.0
    corrected: bool = False  # d is already u = addend + mix·scale·d
    # d not written yet: the pass that writes it, run on first read of d (`Block.d`) unless the
    # trust step runs it as part of its own first pass
    pending: FusedAdamPass | None = None


def _adamw(rule: Any, g: torch.Tensor, st: dict[str, Any], step: Step, f: Fusion) -> Fused:
    n_m, n_v = bias_steps(rule.bias_correction, step.k, step.t)
    split = None if f.grads is None or f.views is None else (
        f.views["out"], f.grads, f.views["exp_avg"], f.views["exp_avg_sq"])
    d, scale, pending = adam_direction_(st["exp_avg"], st["exp_avg_sq"], g, rule.beta1, rule.beta2,
                                        rule.eps, n_m, n_v, out=f.out, mix=f.mix, addend=f.addend,
                                        split=split, defer=f.defer)
    return Fused(d, scale, corrected=f.addend is not None, pending=pending)


def _sgd(rule: Any, g: torch.Tensor, st: dict[str, Any], step: Step, f: Fusion) -> Fused:
    if f.addend is not None:  # u = ρ·Δ_G + (1-ρ)·g in one pass
        return Fused(torch.add(f.addend, g, alpha=f.mix, out=f.out), 1.0, corrected=True)
    return Fused(f.out.copy_(g))  # d = g, in the workspace instead of a fresh copy


FUSED: dict[type[Preconditioner], Callable[[Any, torch.Tensor, dict[str, Any], Step, Fusion], Fused]] = {
    AdamW: _adamw, Adam: _adamw, SGD: _sgd}

FUSED_NAMES = frozenset(cls.name for cls in FUSED)  # registry names: "adamw", "adam", "sgd"


def direction(rule: Preconditioner, g: torch.Tensor, st: dict[str, Any], step: Step,
              fusion: Fusion) -> Fused:
    """The rule's direction on the flat path: its fused pass where listed, else its own."""
    fused = FUSED.get(type(rule))
    if fused is not None:
        return fused(rule, g, st, step, fusion)
    d: Direction = rule.direction(g, st, step)
    return Fused(d.d, d.scale)


def phi_(trust: Trust, scores: torch.Tensor, sizes: Sequence[int], ws: Workspace,
         scale: float = 1.0) -> torch.Tensor:
    """scale·φ of the trust rule written over the scores s = u ⊙ g: the built-in rules by their
    `mode` (trust.py: the radix / band top-k, the cautious mask), a rule of the user's own
    through its own `phi_`."""
    if type(trust).phi_ is not Trust.phi_ or trust.mode == "none":
        return trust.phi_(scores, sizes, ws, scale)
    if isinstance(trust, _Ranked):
        return trust_phi_(scores, trust.mode, trust.tau, trust.trust_alpha, trust.trust_gamma, sizes,
                          per_tensor=trust.per_tensor, ws=ws, scale=scale)
    return trust_phi_(scores, trust.mode, 0.5, 1.0, 1.0, sizes, per_tensor=False, ws=ws, scale=scale)
