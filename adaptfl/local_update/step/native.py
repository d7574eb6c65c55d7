"""The native form of the local step: FedACT's AdamW direction, trust modulation and step on
the CPU in two native passes (local_update/native.py builds them), the same numbers as torch's
fused AdamW kernel and the fused passes they replace (fused_adam.FusedAdamPass, trust.act_phi_,
then Block.move), in one call (`act`):

1. the first pass runs the kernel's arithmetic (u = ρ·Δ_G + the AdamW direction, m and v
   updated), forms the scores s = u ⊙ g without storing them and counts the band around the
   previous step's threshold (band.py); the k-th largest and the first tie it drops are
   picked among the band's few entries.
2. the second writes x = (1 - δ)·x + (-L·φ) ⊙ u, φ = α above the threshold (and on the ties
   the top k keeps: those below the first dropped one), γ elsewhere.

If that band misses, the scores are stored in g's buffer (as the fused passes do) and the
sample's band tried (`band.select(..., hint=False)`); the step then reads them from there. If
both miss, the fused passes finish the step (the radix selection).

`Steady` keeps what FedACT's step needs between steps (the buffers, the state's flat slots,
ρ·Δ_G), so that a step whose settings did not change is this file's `run`, the rule's bias
correction and the band's bookkeeping: `step/local_step.py` asks `Steady.fits` first.
"""

from __future__ import annotations

import itertools
import math
from typing import TYPE_CHECKING, cast

import torch

from adaptfl.local_update import band, native
from adaptfl.local_update.rules.adam import AdamW, bias_steps, kernel_arguments, kernel_coefficients
from adaptfl.local_update.trust import act_phi_
from adaptfl.local_update.workspace import Workspace

if TYPE_CHECKING:
    from adaptfl.local_update.blocks import Block
    from adaptfl.local_update.modulation import ACT
    from adaptfl.local_update.shell import LocalUpdate
    from adaptfl.local_update.step.choose import Path

_CAP = 8  # band positions kept per thread: up to 1/_CAP of its entries (more: counted a miss)
Adam = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]  # addend, m, v, coefficients


class Buffers:
    """The native call's scratch for one vector of n entries read as `sizes` gradients, made
    once (a step makes no tensor): band positions and scores per thread, counts, the pick's
    work, the AdamW coefficients, the gradients' addresses and offsets."""

    def __init__(self, like: torch.Tensor, sizes: tuple[int, ...]) -> None:
        n = sum(sizes)
        self.lib = native.library()
        self.n, self.sizes, self.threads = n, sizes, torch.get_num_threads()
        self.nt = native.threads(n)
        cap = n // (_CAP * self.nt) + 256
        self.index = torch.empty(cap * self.nt, dtype=torch.int64)
        self.values, self.work = torch.empty(cap * self.nt, dtype=like.dtype), torch.empty(cap * self.nt + 1)
        self.counts = torch.empty(2 * self.nt, dtype=torch.int64)
        self.ipos = torch.empty(2, dtype=torch.int64)
        self.coef = torch.empty(6)
        self.pointers = torch.empty(max(len(sizes), 1), dtype=torch.int64)
        self.offsets = torch.tensor([0, *itertools.accumulate(sizes)], dtype=torch.int64)
        self.whole = torch.tensor([0, n], dtype=torch.int64)

    def suit(self, sizes: tuple[int, ...]) -> bool:
        return self.sizes == sizes and self.current()

    def current(self) -> bool:
        """Made for torch's threads as they are, with the loops loaded."""
        return self.threads == torch.get_num_threads() and self.lib is not None

    def segments(self, g: torch.Tensor, grads: list[torch.Tensor] | None) -> tuple[int, int, int]:
        """g as the loops read it: the gradients where they lie, else g itself (addresses,
        offsets, count)."""
        if grads is None:
            self.pointers.numpy()[0] = g.data_ptr()
            return self.pointers.data_ptr(), self.whole.data_ptr(), 1
        self.pointers.numpy()[:] = [t.data_ptr() for t in grads]
        return self.pointers.data_ptr(), self.offsets.data_ptr(), len(grads)


def buffers_for(ws: Workspace, like: torch.Tensor, sizes: tuple[int, ...]) -> Buffers:
    """The workspace's native buffers, made again when the sizes or torch's threads change."""
    made = ws.native
    if not isinstance(made, Buffers) or not made.suit(sizes):
        made = ws.native = Buffers(like, sizes)
    return made


def act(x: torch.Tensor, u: torch.Tensor, adam: Adam | None, segments: tuple[int, int, int],
        lo: float, hi: float, k: int, decay: float | None, ca: float, cg: float, b: Buffers
        ) -> tuple[float, int] | None:
    """The first pass (the AdamW kernel's work with adam = (a, m, v, coef), else u as it is),
    the pick of the k-th largest score in [lo, hi], then the step x = decay·x + f ⊙ u with
    f = ca on the top k, cg elsewhere, in one call: (t, #band entries) if the band held the
    k-th largest score and x was stepped; None (x untouched, the first pass done) if it missed."""
    lib = b.lib
    if lib is None:
        raise RuntimeError("the native loops are not available here (choose_path checks first)")
    a, m, v, coef = (None,) * 4 if adam is None else (t.data_ptr() for t in adam)
    if adam is None:
        vec, kind = 1, 0
    elif lib.adam is None:
        raise RuntimeError("act with adam needs a form of torch's AdamW kernel (none matched here)")
    else:
        vec, kind = lib.adam
    if not lib.dll.adaptfl_act(x.data_ptr(), u.data_ptr(), a, m, v, *segments, u.numel(), coef, vec,
                               kind, lo, hi, b.index.data_ptr(), b.values.data_ptr(),
                               b.index.numel() // b.nt, b.counts.data_ptr(), b.nt, b.work.data_ptr(),
                               b.ipos.data_ptr(), k, 1.0 if decay is None else decay, decay is not None,
                               ca, cg, lib.fused):
        return None
    return float(b.work.numpy()[-1]), int(b.ipos.numpy()[0])  # numpy: no dispatcher call


def act_step_(x: torch.Tensor, u: torch.Tensor, g: torch.Tensor, trust: tuple[float, float, float],
              scale: float, decay: float | None, ws: Workspace, b: Buffers,
              grads: list[torch.Tensor] | None = None, grad_views: list[torch.Tensor] | None = None,
              adam: Adam | None = None) -> None:
    """x = decay·x + (scale·φ) ⊙ u for `act` with trust = (τ, α, γ) ranked over the whole
    vector, s = u ⊙ g (g may be overwritten by s), where `step/choose.py` chose this form.
    With `grads`, g is not filled
    yet: the loops read the gradients where they are, and a band that misses copies them into
    g (its `grad_views`) first. With `adam`, u is not written yet: the first pass does the
    AdamW kernel's work (choose_path's `native_adam`)."""
    tau, alpha, gamma = trust
    n = u.numel()
    k = math.floor(tau * n)
    key = band._key(g, k)
    previous = band.previous_band(key, ws)
    if previous is not None or adam is not None:  # no band yet: an empty one runs the first pass
        lo, hi = (0.0, -1.0) if previous is None else previous
        found = act(x, u, adam, b.segments(g, grads), lo, hi, k, decay, alpha * scale, gamma * scale, b)
        if previous is not None:
            band.counted(key, ws, previous, n, *(found or (None,)))
        if found is not None:
            return
    if grads is not None:  # the loops did not read them in place: g is filled now
        if grad_views is None:
            raise ValueError("act_step_ with grads needs their grad_views (g's views) to copy them into")
        torch._foreach_copy_(grad_views, grads)
    _step_after_a_miss(x, u, g, k, tau, alpha, gamma, scale, decay, ws)


def _step_after_a_miss(x: torch.Tensor, u: torch.Tensor, g: torch.Tensor, k: int, tau: float,
                       alpha: float, gamma: float, scale: float, decay: float | None,
                       ws: Workspace) -> None:
    """The band missed or there was none: the scores stored in g's buffer, the sample's band;
    where that misses too, the fused passes (radix selection)."""
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


class Steady:
    """FedACT's native step (AdamW's kernel in the loops, the correction fused, the gradients
    read where backward left them), kept while nothing it was prepared from changes: the one
    param group and its rule, the parameters' memory, the state's flat slots and step
    counts, Δ_G's contents, ρ, the trust rule and torch's threads. `fits` checks that and
    returns the gradients; `run` is then the same step as the general path's, bit for bit."""

    def __init__(self, opt: LocalUpdate, block: Block, path: Path, trust: ACT) -> None:
        group = opt.param_groups[0]
        self.group, self.params = group, list(group["params"])
        self.state, self.states = opt.state, [opt.state[p] for p in self.params]
        self.k = self.states[0]["step"]
        self.flat = opt._flat[0]
        self.slots = tuple(self.flat[s] for s in ("exp_avg", "exp_avg_sq", "global_direction"))
        self.dg_version = self.slots[2]._version
        if block.pending is None or block.pending.addend is None or block.bucket is None:
            raise ValueError("a steady native step needs the kernel's deferred pass with ρ·Δ_G")
        if block._d is None:
            raise ValueError("a steady native step needs the direction's buffer")
        self.addend, self.rule = block.pending.addend, cast(AdamW, opt.rule(group))  # native_adam
        self.x, self.u, self.g, self.grad_views = block.bucket, block._d, block.g, block.grad_views
        self.ptrs = [p.data_ptr() for p in self.params]
        self.rho, self.trust, self.path, self.dtype = opt.rho, trust, path, self.x.dtype
        self.act = (trust.tau, trust.trust_alpha, trust.trust_gamma)
        self.buffers = buffers_for(opt.work, self.x, tuple(p.numel() for p in self.params))

    def fits(self, opt: LocalUpdate) -> list[torch.Tensor] | None:
        """The gradients, if the coming step is the one this was prepared for; else None."""
        if not (self._same_settings(opt) and self._same_state(opt)):
            return None
        grads = []
        for p in self.params:
            t = p.grad
            if t is None or t.dtype != self.dtype or not t.is_contiguous():
                return None
            grads.append(t)
        return grads

    def _same_settings(self, opt: LocalUpdate) -> bool:
        """One param group, this one, with lr > 0 and its rule's fields as they were (the step
        reads lr and weight decay afresh); ρ, the trust rule, the correction and torch's threads
        unchanged."""
        group = self.group
        return (len(opt.param_groups) == 1 and opt.param_groups[0] is group and group["lr"] > 0.0
                and opt.rule(group) is self.rule and opt.rho == self.rho and opt.trust is self.trust
                and opt.correction == "mix" and self.buffers.current())

    def _same_state(self, opt: LocalUpdate) -> bool:
        """The state's flat slots the very tensors (Δ_G unwritten since), the parameters' memory
        and the step counts as this left them."""
        m, v, dg = self.slots
        flat = opt._flat[0] if len(opt._flat) == 1 else None
        return (opt.state is self.state and flat is self.flat and opt.work.native is self.buffers
                and flat.get("exp_avg") is m and flat.get("exp_avg_sq") is v
                and flat.get("global_direction") is dg and dg._version == self.dg_version
                and [p.data_ptr() for p in self.params] == self.ptrs
                and all(st["step"] == self.k for st in self.states))

    def follow(self) -> None:
        """After a step the general path took (a diagnostics step records its scores): the step
        counts it moved are the ones to check next; `fits` still checks everything else."""
        self.k = self.states[0]["step"]

    def run(self, opt: LocalUpdate, grads: list[torch.Tensor]) -> None:
        group, rule = self.group, self.rule
        lr, ref_lr = group["lr"], opt.ref_lr
        for st in self.states:
            st["step"] += 1
        self.k += 1
        n_m, n_v = bias_steps(rule.bias_correction, self.k, opt.step_offset + self.k)
        kernel_lr, kernel_step = kernel_arguments(rule.beta1, n_m, n_v, (1.0 - self.rho) * (lr / ref_lr))
        coef = kernel_coefficients(rule.beta1, rule.beta2, rule.eps, kernel_lr, kernel_step,
                                   self.buffers.coef)
        decay = lr * group["weight_decay"]
        act_step_(self.x, self.u, self.g, self.act, -ref_lr, 1.0 - decay if decay else None, opt.work,
                  self.buffers, grads, self.grad_views, (self.addend, self.slots[0], self.slots[1], coef))
