"""`local_step`: the one door of a `LocalUpdate` step. It asks `choose_path` once which form
runs (step/choose.py, every condition and its reason), then runs the chain of the module
docstring of shell.py in that form:

    directions   each group's rule: one flat block (an elementwise rule, every parameter
                 active at one step count) or one block per tensor (eager.py)
    correction   u = (1-ρ)·(c/L)·d + ρ·Δ_G, fused into the direction's last pass where the
                 path says so (fused.py)
    trust        φ from the scores s = u ⊙ g (native.py's loops, or fused.py's passes)
    move         x = (1 - δ)·x + (-L·φ) ⊙ u

While FedACT's native step can be repeated as prepared (`native.Steady.fits`), the door runs
it directly; anything else takes the general path, which prepares it again where it runs the
native form (a diagnostics step, which forms its scores before the loops, leaves the
preparation as it was).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, cast

import torch

from adaptfl.local_update.blocks import Block
from adaptfl.local_update.modulation import ACT
from adaptfl.local_update.rules import Preconditioner, Step
from adaptfl.local_update.rules.adam import kernel_coefficients
from adaptfl.local_update.step import eager, fused, native
from adaptfl.local_update.step.choose import Path, choose_path, flat_layout, native_declines
from adaptfl.local_update.step.fused import Fusion

if TYPE_CHECKING:
    from adaptfl.local_update.shell import LocalUpdate


def local_step(opt: LocalUpdate, g_hat: Mapping[str, torch.Tensor] | None = None,
               path: Path | None = None) -> Path | None:
    """One step of `opt` (its gradients set), in the form `path` names (None: `choose_path`'s),
    then Sophia's h refreshed from ĝ where given. Returns the path taken (None: no gradient)."""
    opt.steps += 1
    steady, taken = opt.steady, None
    if path is None and steady is not None and not opt.diagnostics_due():
        grads = steady.fits(opt)
        if grads is not None:
            steady.run(opt, grads)
            taken = steady.path
    if taken is None:
        taken = _general(opt, path)
        if steady is not None and opt.steady is steady:  # not prepared again: still valid if
            steady.follow()  # nothing but the step counts moved (a diagnostics step)
    if taken is not None:
        opt.paths[taken.form] += 1
        opt.last_path = taken
    if g_hat is not None:
        opt._refresh_hessian(g_hat)
    return taken


def _general(opt: LocalUpdate, forced: Path | None) -> Path | None:
    groups = opt.param_groups
    rules = [opt.rule(group) for group in groups]
    actives = [[p for p in group["params"] if p.grad is not None] for group in groups]
    path = choose_path(opt, rules[0], actives[0]) if forced is None else forced
    if path.form == "native" and (why := native_declines(opt, rules[0])) is not None:
        opt.steps -= 1  # the step was not taken
        raise ValueError(f"the native form cannot take this step: {why}")
    blocks = []
    for gi, group in enumerate(groups):
        if actives[gi]:
            blocks.extend(_directions(opt, gi, group, rules[gi], actives[gi], path))
    if not blocks:
        return None
    chain = opt.trust.active or any(b.corrected for b in blocks)
    in_chain = opt._measure(blocks, chain)  # diagnostics never change the step
    if chain:
        _chain(opt, blocks, in_chain, path)
    else:  # each rule's own step in its authors' order, then the correction (FedPAC,
        # seed 001: x -= ρ·lr·g_G after the step)
        for block in blocks:
            block.apply_own_step(1.0 - opt.rho)
            block.add_correction(-opt.ref_lr * opt.rho)
    return path


def _directions(opt: LocalUpdate, gi: int, group: dict[str, object], rule: Preconditioner,
                active: list[torch.Tensor], path: Path) -> list[Block]:
    lr, wd = cast(float, group["lr"]), cast(float, group["weight_decay"])
    states = [opt.state[p] for p in active]
    for st in states:
        st["step"] += 1
    steps = {st["step"] for st in states}
    decay = 0.0 if rule.coupled_decay else lr * wd
    if opt.correction == "after-step":  # FedPAC: the local optimizer (and so its decay)
        decay *= 1.0 - opt.rho  # runs at lr·(1-ρ); the (1-ρ) of its move is the chain's
    if flat_layout(rule, active, cast(list[torch.Tensor], group["params"]), steps):
        return [_flat_block(opt, gi, rule, active, steps.pop(), lr, wd, decay, path)]
    return eager.tensor_blocks(rule, active, opt.state, steps, lr, wd, decay,
                               Step(0, opt.step_offset, opt.mix_lambda, opt.bs))


def _flat_block(opt: LocalUpdate, gi: int, rule: Preconditioner, active: list[torch.Tensor], k: int,
                lr: float, wd: float, decay: float, path: Path) -> Block:
    """The whole group as one flat vector (an elementwise rule, every parameter active at one
    step count): the rule's direction in the group's `u` buffer, gradients read in place where
    the path lets them stay."""
    g, views = opt._flat_grad(gi, active)
    n, like = g.numel(), g
    out = opt.work.get(f"u{gi}", n, like)
    bucket = opt._bucket(gi, active) if opt.bucket_view else None
    grads = cast(list[torch.Tensor], [p.grad for p in active])  # active: the params with a grad
    in_place = path.grads_stay
    if not in_place:
        torch._foreach_copy_(views, grads)
    if rule.coupled_decay and wd:  # coupled L2, as torch.optim.Adam
        g.add_(torch.cat([p.reshape(-1) for p in active], out=opt.work.get("x", n, like)), alpha=wd)
    st = opt._flat[gi]
    # The rule may fuse u = ρ·Δ_G + (1-ρ)·(lr/L)·d itself (lr/L = 1 unless this group runs at
    # its own lr, as Muon's AdamW half does) and leave that pass to the native loops.
    mix = (1.0 - opt.rho) * (lr / opt.ref_lr if opt.ref_lr else 1.0)
    fusion = Fusion(out, mix, _scaled_direction(opt, st["global_direction"])
                    if path.fuse_correction else None, defer=path.form == "native")
    if in_place:
        fusion.grads = grads
        fusion.views = {"out": _views_of(opt, gi, "out", out, active),
                        **{slot: _views_of(opt, gi, slot, st[slot], active) for slot in rule.slots}}
    d = fused.direction(rule, g, st, Step(k, opt.step_offset + k, opt.mix_lambda, opt.bs), fusion)
    eager.check_fresh(rule, d.d, st, g)
    return Block(active, d.d, g, lr * d.scale, decay, rule.decay_after, st.get("global_direction"),
                 flat=True, corrected=d.corrected, bucket=bucket, grads=grads if in_place else None,
                 grad_views=views, pending=d.pending)


def _views_of(opt: LocalUpdate, gi: int, name: str, flat: torch.Tensor, params: list[torch.Tensor]
              ) -> list[torch.Tensor]:
    """Views of one of the group's flat buffers shaped like its parameters (the same memory as
    `state[p][name]` for a slot), made once per buffer."""
    key = (flat.data_ptr(), flat.numel(), len(params))
    made = opt._views.get((gi, name))
    if made is None or made[0] != key:
        views = [v.view_as(p) for v, p in zip(torch.split(flat, [p.numel() for p in params]), params,
                                              strict=True)]
        opt._views[(gi, name)] = made = (key, views)
    return made[1]


def _scaled_direction(opt: LocalUpdate, direction: torch.Tensor) -> torch.Tensor:
    """ρ·Δ_G, computed once per Δ_G (its version counter tells when it was rewritten)."""
    key = (direction.data_ptr(), direction._version, opt.rho)
    if opt._scaled_key != key:
        opt._scaled = torch.mul(direction, opt.rho, out=opt.work.get("rho-dg", direction.numel(), direction))
        opt._scaled_key = key
    return cast(torch.Tensor, opt._scaled)  # computed together with _scaled_key, so set here


def _chain(opt: LocalUpdate, blocks: list[Block], diagnose: bool, path: Path) -> None:
    """u = (1-ρ)·(c/L)·d + ρ·Δ_G over every active coordinate, modulated, then stepped:
    combine → (the trust rule's own fused passes, where it has them) → modulate → move."""
    if len(blocks) == 1 and blocks[0].flat:  # FedACT's path: everything in place on one vector
        u, g, at_step = _combine_flat(opt, blocks[0])
    else:
        u, g, at_step = eager.combine(blocks, opt.ref_lr, opt.rho, opt.work)
    scale = -opt.ref_lr * at_step  # the step's factor of u
    b = blocks[0]
    if path.form == "native":  # FedACT on a CPU: the native loops (step/native.py)
        _native(opt, b, u, g, scale, path, diagnose)
        return
    b.settle()  # u written, if its pass was left to the trust step
    sizes = [p.numel() for b in blocks for p in b.params]
    phi = _modulate(opt, b, u, g, sizes, diagnose, scale)
    if len(blocks) == 1 and b.bucket is not None:  # one pass over the flat parameters
        b.move(u, scale, phi)
    elif any(b.decay_after for b in blocks):
        eager.move_decaying_after(blocks, u, sizes, phi, opt.ref_lr, opt.rho)
    else:
        eager.move(blocks, u, sizes, phi, scale)


def _native(opt: LocalUpdate, b: Block, u: torch.Tensor, g: torch.Tensor, scale: float, path: Path,
            diagnose: bool) -> None:
    """The native form's step of one flat block, prepared to repeat where it can. A step that
    records PosRatio/TopMass forms its scores s = u ⊙ g first (the loops never store them): the
    kernel then runs on its own and the loops take u as written."""
    trust = cast(ACT, opt.trust)  # choose_path: the native form is ACT's
    buffers = native.buffers_for(opt.work, g, tuple(p.numel() for p in b.params))
    kernel, adam = b.pending, None
    if path.native_adam and not diagnose and kernel is not None and kernel.addend is not None:
        coef = kernel_coefficients(kernel.beta1, kernel.beta2, kernel.eps, kernel.lr, kernel.step,
                                        buffers.coef)
        adam = (kernel.addend, kernel.exp_avg, kernel.exp_avg_sq, coef)
    else:
        b.settle()  # the kernel runs first; the loops read its u
    if diagnose:
        b.fill_g()  # where the gradients stayed in place
        opt._record(torch.mul(g, u, out=opt.work.get("diag.s", g.numel(), g)))
    native.act_step_(cast(torch.Tensor, b.bucket), u, g, (trust.tau, trust.trust_alpha, trust.trust_gamma),
                     scale, b.decay_factor(), opt.work, buffers, b.grads, b.grad_views, adam)
    if adam is not None and path.grads_stay and opt.correction == "mix":
        opt.steady = native.Steady(opt, b, path, trust)


def _combine_flat(opt: LocalUpdate, b: Block) -> tuple[torch.Tensor, torch.Tensor, float]:
    """u of one flat block, in place in its direction's buffer; (u, g, the factor of u left to
    the step: the scores are scale-invariant, so without correction c/L joins the step)."""
    # corrected: u = ρ·Δ_G + (1-ρ)·(c/L)·d already (the rule fused it); its pass may still be
    # pending, and the trust step below may run it itself
    u = b._d if b.corrected else b.d
    if u is None:
        raise RuntimeError("an elementwise rule's flat step needs a direction; its rule gave none")
    if b.corrected:
        return u, b.g, 1.0
    ratio = b.coef / opt.ref_lr if opt.ref_lr else 1.0
    if opt.rho <= 0.0:  # no correction: the ranking of s = u ⊙ g and the diagnostics do not
        return u, b.g, ratio  # change with a positive factor, applied in the step's pass
    u.mul_((1.0 - opt.rho) * ratio)
    if b.global_direction is not None:  # Δ_G = 0 before the first aggregation
        u.add_(b.global_direction, alpha=opt.rho)
    return u, b.g, 1.0


def _modulate(opt: LocalUpdate, b: Block, u: torch.Tensor, g: torch.Tensor, sizes: list[int],
              diagnose: bool, scale: float) -> torch.Tensor | None:
    """s = u ⊙ g (in g's buffer: g is not read after this), the diagnostics of s, and the trust
    factors -L·φ (the step's factor folded in, so x += φ ⊙ u is one pass); None: no trust."""
    if not (opt.trust.active or diagnose):
        return None
    b.fill_g()  # where the gradients stayed in place
    scores = g.mul_(u)
    if diagnose:
        opt._record(scores)
    return fused.phi_(opt.trust, scores, sizes, opt.work, scale=scale) if opt.trust.active else None
