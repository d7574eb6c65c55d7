"""The fast passes of AdamW's and SGD's directions, kept out of the rules, which stay pure
(`rules/`: a fresh d from g and the state). On the one-vector path of a single param group
(`LocalUpdate._flat_block`) a rule listed here, by its exact class, may:

- write its direction into the chain's workspace instead of a fresh tensor;
- read the gradients where backward left them, per tensor (torch's fused AdamW kernel, as
  `AdamW(fused=True)` runs it), so the chain copies them into g only where it reads g;
- carry the correction in its last pass: u = ρ·Δ_G + (1-ρ)·(lr/L)·d, flagged `corrected`;
- leave that pass to the trust step (`pending`), which may do the same work in its own first
  pass (FedACT's native loops, fused_act.py).

A subclass that changes `direction` is not listed, so it runs through its own `direction` and the
chain does the rest: a new rule cannot inherit a fast path that computes something else.
tests/local_update/test_rule_purity.py runs each rule through every path it is eligible for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from adaptfl.local_update.rules import Direction, Preconditioner, Step
from adaptfl.local_update.rules.adam import Adam, AdamW, FusedAdamPass, adam_direction_, bias_steps, fuses
from adaptfl.local_update.rules.sgd import SGD


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
READS_IN_PLACE = (AdamW, Adam)  # the fused kernel takes the gradients as per-tensor lists
FUSED_NAMES = frozenset(cls.name for cls in FUSED)  # registry names: "adamw", "adam", "sgd"


def direction(rule: Preconditioner, g: torch.Tensor, st: dict[str, Any], step: Step,
              fusion: Fusion) -> Fused:
    """The rule's direction on the flat path: its fused pass where listed, else its own."""
    fused = FUSED.get(type(rule))
    if fused is not None:
        return fused(rule, g, st, step, fusion)
    d: Direction = rule.direction(g, st, step)
    return Fused(d.d, d.scale)


def reads_in_place(rule: Preconditioner, g: torch.Tensor) -> bool:
    """Whether the rule's fused pass reads the gradients per tensor, where they lie."""
    return type(rule) in READS_IN_PLACE and fuses(g)
