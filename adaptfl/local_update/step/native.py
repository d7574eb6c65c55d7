"""The native form of the local step: FedACT's AdamW direction, trust modulation and step on
the CPU in two native passes (local_update/native.py), the same numbers as torch's fused AdamW
kernel and the eager passes they replace (fused_adam.FusedAdamPass, trust.act_phi_, then
Block.move), in one call (`native.act`):

1. the first pass runs the kernel's arithmetic (u = ρ·Δ_G + the AdamW direction, m and v
   updated), forms the scores s = u ⊙ g without storing them and counts the band around the
   previous step's threshold (band.py); `native.pick` finds the k-th largest and the first
   tie it drops among the band's few entries.
2. `native.step` writes x = (1 - δ)·x + (-L·φ) ⊙ u, φ = α above the threshold (and on the ties
   the top k keeps: those below the first dropped one), γ elsewhere.

If that band misses, the scores are stored in g's buffer (as the eager passes do) and the
sample's band tried (`band.select(..., hint=False)`); the step then reads them from there. If
both miss, the eager passes finish the step (the radix selection). Where no native form of the
kernel matched torch's here, the kernel runs first and the band pass reads its u.
"""

from __future__ import annotations

import itertools
import math
from typing import cast

import torch

from adaptfl.local_update import band, native
from adaptfl.local_update.step.fused_adam import FusedAdamPass
from adaptfl.local_update.trust import act_phi_
from adaptfl.local_update.workspace import Workspace

_CAP = 8  # band positions kept per thread: up to 1/_CAP of its entries (more: counted a miss)


def _segments(g: torch.Tensor, grads: list[torch.Tensor] | None, ws: Workspace) -> native.Segments:
    """g as the loops read it: the gradients where they lie, else g itself; the addresses and
    offsets in workspace buffers (no tensor made per step)."""
    tensors = [g] if grads is None else grads
    pointers = ws.get("act.pointers", len(tensors), g, torch.int64)
    pointers.numpy()[:] = [t.data_ptr() for t in tensors]
    sizes = tuple(map(torch.Tensor.numel, tensors))
    offsets = ws.filled("act.offsets", len(tensors) + 1, g, torch.int64, sizes,
                        lambda buf: buf.numpy().__setitem__(slice(None), [0, *itertools.accumulate(sizes)]))
    return native.Segments(tensors, offsets, pointers)


def act_step_(x: torch.Tensor, u: torch.Tensor, g: torch.Tensor, tau: float, alpha: float,
              gamma: float, scale: float, decay: float | None, ws: Workspace,
              grads: list[torch.Tensor] | None = None,
              grad_views: list[torch.Tensor] | None = None,
              pending: FusedAdamPass | None = None, adam: bool = False) -> None:
    """x = decay·x + (scale·φ) ⊙ u for `act` ranked over the whole vector, s = u ⊙ g (g may be
    overwritten by s), where `step/choose.py` chose this form (float32 on a CPU, the loops
    built, 0 < ⌊τD⌋ < D, scale < 0). With `grads`, g is not filled yet: the loops read the
    gradients where they are, and a band that misses copies them into g (its `grad_views`)
    first. With `pending`, u is not written yet: with `adam` (choose_path's `native_adam`) the
    band's pass does the kernel's work (`native.act`), else the kernel runs first."""
    kernel = pending if adam else None
    if pending is not None and kernel is None:
        pending.run()
    n = u.numel()
    k = math.floor(tau * n)
    key = band._key(g, k)
    previous = band.previous_band(key, ws)
    if previous is not None:  # the previous threshold's band: one native call does the step
        nt = native.threads(n)
        cap = n // (_CAP * nt) + 256
        fused_pass = None if kernel is None else (
            cast(torch.Tensor, kernel.addend), kernel.exp_avg, kernel.exp_avg_sq,  # native_adam: fused
            native.adam_coefficients(kernel.beta1, kernel.beta2, kernel.eps, kernel.lr, kernel.step,
                                     ws.get("act.adam", 6, g)))
        kernel = None  # done by the call, hit or miss
        found = native.act(x, u, fused_pass, _segments(g, grads, ws), *previous, k, decay,
                           alpha * scale, gamma * scale, ws.get("act.index", cap * nt, g, torch.int64),
                           ws.get("act.values", cap * nt, g), ws.get("act.counts", 2 * nt, g, torch.int64),
                           nt, ws.get("act.work", cap * nt + 1, g), ws.get("act.ipos", 2, g, torch.int64))
        band.counted(key, ws, previous, n, *(found or (None,)))
        if found is not None:
            return
    if kernel is not None:  # no band to count yet (the first step): u from the kernel itself
        kernel.run()
    if grads is not None:  # the loops did not read them in place: g is filled now
        if grad_views is None:
            raise ValueError("act_step_ with grads needs their grad_views (g's views) to copy them into")
        torch._foreach_copy_(grad_views, grads)
    _step_after_a_miss(x, u, g, k, tau, alpha, gamma, scale, decay, ws)


def _step_after_a_miss(x: torch.Tensor, u: torch.Tensor, g: torch.Tensor, k: int, tau: float,
                       alpha: float, gamma: float, scale: float, decay: float | None,
                       ws: Workspace) -> None:
    """The band missed or there was none: the scores stored in g's buffer, the sample's band;
    where that misses too, the eager passes (radix selection)."""
    n = u.numel()
    sel = band.select(g.mul_(u), k, ws, hint=False)
    if sel is None:  # both bands missed
        phi = act_phi_(g, tau, alpha, gamma, None, ws, scale)
        if decay is not None:
            x.mul_(decay)
        x.addcmul_(u, phi)
        return
    cut = n if sel.drop is None else int(sel.drop[0])
    native.step(x, u, native.Segments.flat(g), sel.t, cut, decay, alpha * scale, gamma * scale, True)
