"""`choose_path`: the one place that decides which form runs a local step, and says why.

The forms of one `LocalUpdate` step (each the same arithmetic as `step/reference.py`):

    native  FedACT's AdamW direction, scores, global top-k and step as two C loops
            (step/native.py over local_update/native.py): float32 on a CPU with a compiler
    fused   one flat vector per param group through torch's kernels (the fused AdamW kernel,
            foreach passes) and the radix / band top-k (step/fused.py, topk.py)
    eager   each tensor's own direction, then the chain's generic passes (Muon, SOAP, several
            param groups, a rule of the user's own, a partial step)

Modelled on torch.optim's `_default_to_fused_or_foreach`: every condition of every form is
here, each with the reason it declines, so a reader who wants to know why a step ran where it
did reads one function, and `local_step` (step/local_step.py) acts on the returned `Path`
without asking again; while FedACT's native step repeats as prepared (`native.Steady`), its
`fits` only re-checks that nothing this decision read has changed. The cohort engine asks the
same function (engine/cohort.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import numpy as np
import torch

from adaptfl.local_update import native as loops
from adaptfl.local_update.devices import cpu_path
from adaptfl.local_update.modulation import ACT
from adaptfl.local_update.rules import Preconditioner
from adaptfl.local_update.rules.adam import Adam, AdamW
from adaptfl.local_update.step.fused import FUSED
from adaptfl.local_update.step.fused_adam import fuses
from adaptfl.local_update.topk import _SMALL

if TYPE_CHECKING:
    from adaptfl.local_update.shell import LocalUpdate

FORMS = ("native", "fused", "eager")
READS_IN_PLACE = (AdamW, Adam)  # the fused kernel takes the gradients as per-tensor lists


@dataclass(frozen=True)
class Path:
    """The form one step runs in and why, with what the fused form may do on the way."""

    form: str  # one of FORMS
    reason: str
    grads_stay: bool = False  # the AdamW kernel reads the gradients where backward left them
    fuse_correction: bool = False  # the direction's last pass writes u = ρ·Δ_G + (1-ρ)·(lr/L)·d
    native_adam: bool = False  # the native loops do the AdamW kernel's pass too (`loops.act`)


def choose_path(opt: LocalUpdate, rule: Preconditioner, active: list[torch.Tensor]) -> Path:
    """The form of `opt`'s coming step: `rule` and `active` (its parameters with a gradient)
    are its first group's. Every form records PosRatio/TopMass where the step is due to (the
    native form from u and g before its loops run)."""
    groups = opt.param_groups
    group = groups[0]
    params = group["params"]
    if len(groups) != 1:
        return Path("eager", f"{len(groups)} param groups: one block per tensor")
    if not rule.elementwise:
        return Path("eager", f"{rule.name} is a per-tensor rule")
    if not flat_layout(rule, active, params, {opt.state[p]["step"] for p in active}):
        return Path("eager", "a parameter without a gradient or at another step count")
    like = params[0]
    stay = _grads_stay(opt, rule, like, [cast(torch.Tensor, p.grad) for p in active])  # active: set
    fuse = opt.rho > 0.0 and opt.has_flat_slot("global_direction")
    declined = native_declines(opt, rule)
    if declined is None:
        return Path("native", "FedACT's AdamW, scores, top-k and step in the C loops", stay, fuse,
                    _native_adam(opt, rule, like, fuse))
    if type(rule) in FUSED:
        return Path("fused", f"torch's kernels ({declined})", stay, fuse)
    return Path("fused", f"{rule.name}'s own direction, torch's kernels after it ({declined})")


def flat_layout(rule: Preconditioner, active: list[torch.Tensor], params: list[torch.Tensor],
                steps: set[int]) -> bool:
    """Whether a group steps as one flat vector: an elementwise rule, every parameter with a
    gradient, all at one step count (else one block per tensor)."""
    return rule.elementwise and len(active) == len(params) and len(steps) == 1


def _grads_stay(opt: LocalUpdate, rule: Preconditioner, like: torch.Tensor,
                grads: list[torch.Tensor]) -> bool:
    """Whether the gradients stay where backward left them, unflattened: the rule reads them
    per tensor (torch's fused AdamW kernel, as `AdamW(fused=True)` runs it) and the chain copies
    them into g only where it reads g (`Block.fill_g`: the scores, the diagnostics)."""
    wd = opt.param_groups[0]["weight_decay"]
    return type(rule) in READS_IN_PLACE and not (rule.coupled_decay and wd) \
        and fuses(like) and all(t.is_contiguous() and t.dtype == like.dtype for t in grads)


def native_declines(opt: LocalUpdate, rule: Preconditioner) -> str | None:
    """Why the native loops do not take `opt`'s steps (None: they do), its gradients aside:
    the cohort engine asks this before any gradient exists."""
    trust = opt.trust
    like = opt.param_groups[0]["params"][0]
    if type(trust) is not ACT or trust.per_tensor:
        return "the native loops do FedACT's global trust only"
    if not opt.bucket_view:
        return "the parameters are not one bucket"
    group = opt.param_groups[0]
    if rule.decay_after or group["lr"] <= 0.0 or opt.ref_lr <= 0.0:
        return "the step is not a plain descent step"
    n = sum(p.numel() for p in group["params"])
    if not 0 < math.floor(trust.tau * n) < n or n < _SMALL:
        return f"{n} coordinates: one stable sort is cheaper"
    if like.dtype != torch.float32 or not cpu_path(like):
        return "the loops take float32 on a CPU"
    if loops.library() is None:
        return "the native loops are not built here (no C compiler, or ADAPTFL_NATIVE=0)"
    return None


def _native_adam(opt: LocalUpdate, rule: Preconditioner, like: torch.Tensor, fuse: bool) -> bool:
    """Whether the loops' first pass does the AdamW kernel's work too: a form of the kernel
    matched here bit for bit, the correction fused (u = ρ·Δ_G + …, the optimizer's float32
    buffers) and m's update the kernel's small-weight lerp (1-β1 < 0.5 in float)."""
    return type(rule) in READS_IN_PLACE and fuse and fuses(like) and loops.adam_usable() \
        and bool(np.float32(1.0 - rule.beta1) < 0.5)  # type: ignore[attr-defined]
