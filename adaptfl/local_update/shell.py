"""`LocalUpdate`: one `torch.optim.Optimizer` for every preconditioner, running the chain

    d = precondition(g)                 the group's rule (rules/), with FedMIX-P's mixed reference
    u = (1-ρ)·(c/L)·d + ρ·Δ_G           correction with the server's global direction
    u = φ ⊙ u,  s = u ⊙ g               trust modulation (modulation.py)
    x = (1 - δ)·x - L·u                 decoupled weight decay, then the step

where c = lr·scale is the rule's own step (Muon's shape scale, SOAP's bias-corrected size, the
AdamW half of Muon at its own lr) and L is the first param group's lr: the correction and the
trust scores are in its units. δ = lr·wd, times (1-ρ) when the correction is FedPAC's
(`correction="after-step"`: the local optimizer runs at lr·(1-ρ), then x -= ρ·lr·g_G).
Without correction, trust or diagnostics the chain reduces to each rule's own step.

A torch optimizer first: `LocalUpdate(model.parameters(), lr=1e-3)` works; hyperparameters live
in `param_groups` (so `torch.optim.lr_scheduler` works); `state_dict()` / `load_state_dict()`
round-trip everything a next step reads (moments, Δ_G, the FedMIX-P reference, step counts).
Named parameters (`model.named_parameters()`) add export / import of state by NAME, which is
how state crosses the wire (torch's own `state_dict` keys by position).

Elementwise rules keep every per-parameter slot as a view into one flat buffer per group, so
FedACT's update is a handful of passes over one vector and its top-k one global selection.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any, cast

import torch

from adaptfl.core.params import fields_of, lookup
from adaptfl.local_update.blocks import Block
from adaptfl.local_update.diagnostics import Diagnostics
from adaptfl.local_update.groups import as_groups, build_component
from adaptfl.local_update.modulation import ACT, Trust
from adaptfl.local_update.rules import (
    Preconditioner,
    Step,
    field_default,
    fields_from_group,
    group_values,
    torch_keywords,
)
from adaptfl.local_update.slots import NamedSlots
from adaptfl.local_update.step import eager as eager_form
from adaptfl.local_update.step import fused
from adaptfl.local_update.step import native as native_form
from adaptfl.local_update.step.choose import Path, choose_path, flat_layout
from adaptfl.local_update.step.fused import Fusion
from adaptfl.local_update.workspace import Workspace

CORRECTIONS = ("mix", "after-step")
Tensors = dict[str, torch.Tensor]


def eager(method: Any) -> Any:
    """torch.optim.Optimizer's method without its `torch._disable_dynamo` wrapper, which imports
    torch._dynamo (sympy, triton: ~80 MB and ~1 s of CPU) on its first call. A deployed
    ClientApp is a fresh process per message and never compiles, so it paid that on every
    message (docs/scale.md); in eager mode the wrapper only runs the method."""
    return getattr(method, "__wrapped__", method)


class LocalUpdate(NamedSlots, Diagnostics, torch.optim.Optimizer):
    """precondition → mix → correct → modulate → step (see the module docstring).

    Args:
        params: tensors, (name, tensor) pairs or param-group dicts (a group may name its own
            `preconditioner` and its fields).
        lr, weight_decay: the step; None: the preconditioner's default.
        preconditioner: "sgd", "adam", "adamw", "sophia", "muon", "soap" or an instance.
        trust: "none", "act", "mgup", "cautious" or an instance (α = 1/τ, γ = τ unless given).
        rho: weight of the global direction (set it with `set_global_direction`).
        correction: "mix" (FedACT family) or "after-step" (FedPAC).
        step_offset: global steps before this round's first (the paper's bias correction of v).
        mix_lambda: FedMIX-P's λ of this round (1: the client's own state only).
        diagnostics_every: PosRatio/TopMass on every N-th step (0: off), kept on the device.
        parameters_as_bucket_view: keep the parameters of an elementwise group in one flat
            buffer (their `.data` become views into it, as torch's ZeroRedundancyOptimizer
            option of this name does), so the step updates them in one pass per operation
            instead of one call per tensor. Replacing a parameter's `.data` later (`model.to`)
            is noticed and the buffer rebuilt.
        **hyper: fields of the preconditioner or trust rule by name (beta1=..., tau=...).
    """

    def __init__(self, params: Iterable[Any], lr: float | None = None, *,
                 weight_decay: float | None = None, preconditioner: str | Preconditioner = "adamw",
                 trust: str | Trust = "none", rho: float = 0.0, correction: str = "mix",
                 step_offset: int = 0, mix_lambda: float = 1.0, diagnostics_every: int = 0,
                 parameters_as_bucket_view: bool = False, **hyper: Any) -> None:
        rule = build_component("preconditioner", preconditioner, torch_keywords(preconditioner, hyper))
        self.trust: Trust = build_component("trust", trust, hyper)
        if hyper:
            raise TypeError(f"LocalUpdate got unexpected keyword arguments {sorted(hyper)}; "
                            f"{rule.name} takes {[f.name for f in fields_of(type(rule))]}")
        lr = rule.default_lr if lr is None else lr
        weight_decay = rule.default_weight_decay if weight_decay is None else weight_decay
        for name, value, ok in (("lr", lr, lr >= 0.0),
                                ("weight_decay", weight_decay, weight_decay >= 0.0),
                                ("rho", rho, 0.0 <= rho <= 1.0),
                                ("step_offset", step_offset, step_offset >= 0),
                                ("mix_lambda", mix_lambda, 0.0 <= mix_lambda <= 1.0),
                                ("diagnostics_every", diagnostics_every, diagnostics_every >= 0)):
            if not ok:
                raise ValueError(f"invalid {name}={value!r}")
        if correction not in CORRECTIONS:
            raise ValueError(f"invalid correction={correction!r}: choose one of {CORRECTIONS}")
        groups = as_groups(params, rule)
        super().__init__(groups, {"lr": lr, "weight_decay": weight_decay, **group_values(rule)})
        self.rho, self.correction, self.step_offset = rho, correction, step_offset
        self.mix_lambda, self.diagnostics_every = mix_lambda, diagnostics_every
        self.bs = 1  # examples (tokens) in the current batch: Sophia's bs
        self.steps = 0  # optimizer steps taken (the diagnostics schedule)
        self.paths: Counter[str] = Counter()  # steps taken in each form (step/choose.py)
        self.last_path: Path | None = None  # the form of the last step, and why
        self.work = Workspace()
        self._rules: dict[tuple[Any, ...], Preconditioner] = {}
        self._flat: list[dict[str, torch.Tensor]] = [{} for _ in self.param_groups]
        self.bucket_view = parameters_as_bucket_view
        self._buckets: dict[int, tuple[torch.Tensor, list[int]]] = {}  # group -> (flat x, data_ptrs)
        self._grad_views: dict[int, tuple[torch.Tensor, list[torch.Tensor]]] = {}  # group -> (g, views)
        # per-tensor views of a flat buffer: (group, name) -> ((address, length, count), views)
        self._views: dict[tuple[int, str], tuple[tuple[int, ...], list[torch.Tensor]]] = {}
        self._reset_diagnostics()
        self._scaled: torch.Tensor | None = None  # ρ·Δ_G, and what it was computed from
        self._scaled_key: tuple[int, int, float] | None = None
        for gi in range(len(self.param_groups)):
            self._init_group(gi)
        # torch types the hook's argument as Optimizer: it is this LocalUpdate
        self.register_load_state_dict_post_hook(lambda opt: cast(LocalUpdate, opt)._repack())

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """torch's, with the group's hyperparameters under torch's names (`beta1=` given alone
        becomes `betas`) and, once the optimizer is built, its state made for the next `step`
        (progressive unfreezing: the new parameters start at step 0 with zero moments)."""
        name = param_group.get("preconditioner", self.defaults["preconditioner"])
        # cast: the "preconditioner" registry holds Preconditioner subclasses only
        cls = cast(type[Preconditioner], lookup("preconditioner", name))
        group = dict(param_group)
        for key, fields in cls.torch_names.items():
            named = [f for f in fields if f in group]
            if not named:
                continue
            if key in group:
                raise ValueError(f"param group sets both {key}= and {named[0]}=")
            same_rule = cls is lookup("preconditioner", self.defaults["preconditioner"])
            base = fields_from_group(cls, self.defaults) if same_rule else {}
            values = [group.pop(f) if f in group else base.get(f, field_default(cls, f)) for f in fields]
            group[key] = tuple(values) if len(fields) > 1 else values[0]
        eager(torch.optim.Optimizer.add_param_group)(self, group)
        if hasattr(self, "_flat"):  # after the constructor: the new group's state and buffers
            self._flat.append({})
            self._init_group(len(self.param_groups) - 1)

    def zero_grad(self, set_to_none: bool = True) -> None:
        eager(torch.optim.Optimizer.zero_grad)(self, set_to_none)

    def _init_group(self, gi: int) -> None:
        group = self.param_groups[gi]
        lr = self.defaults["lr"]
        group.setdefault("lr_ratio", group["lr"] / lr if lr else 1.0)  # L = lr as scheduled: `ref_lr`
        rule = self.rule(group)
        for p in group["params"]:
            self.state[p].update({"step": 0, **rule.init(p)})
        for slot in rule.slots:
            self._new_slot(gi, slot)

    # --- groups, rules and names ------------------------------------------------------------
    def rule(self, group: dict[str, Any]) -> Preconditioner:
        """The group's rule, rebuilt from its entries (so changing e.g. beta1 there takes effect)."""
        cls = cast(type[Preconditioner], lookup("preconditioner", group["preconditioner"]))  # as above
        given = fields_from_group(cls, group)
        values = tuple((f.name, given.get(f.name, f.default)) for f in fields_of(cls))
        key = (cls, values)
        if key not in self._rules:
            self._rules[key] = cls(**dict(values))
        return self._rules[key]

    @property
    def ref_lr(self) -> float:
        """L: the `lr=` of the constructor as scheduled since. The correction (x -= L·ρ·Δ_G) and
        the trust scores are in its units, whichever group comes first (Muon's AdamW half runs
        at muon-adam-lr; FedPAC's server divides g_G by K·L)."""
        group = self.param_groups[0]
        return float(group["lr"] / group["lr_ratio"] if group["lr_ratio"] else group["lr"])

    # --- the step -----------------------------------------------------------------------------
    def hessian_due(self) -> bool:
        """Whether the coming step refreshes Sophia's h (the caller then passes ĝ to `step`)."""
        for group in self.param_groups:
            rule = self.rule(group)
            if rule.needs_loss:
                k = max((self.state[p]["step"] for p in group["params"]), default=0)
                return rule.refresh_due(k + 1)
        return False

    def extra_loss(self, logits: torch.Tensor, loss_fn: Any) -> torch.Tensor:
        """The loss whose gradient ĝ the coming step's `needs_loss` rule refreshes from
        (Sophia's GNB loss), to pass as `step(g_hat=...)`."""
        rule = next(r for r in map(self.rule, self.param_groups) if r.needs_loss)
        return rule.extra_loss(logits, loss_fn)

    @torch.no_grad()
    def step(self, closure: Any = None, g_hat: Mapping[str, torch.Tensor] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.steps += 1
        groups = self.param_groups
        rules = [self.rule(group) for group in groups]
        actives = [[p for p in group["params"] if p.grad is not None] for group in groups]
        path = choose_path(self, rules[0], actives[0], self.diagnostics_due())
        blocks = []
        for gi, group in enumerate(groups):
            if actives[gi]:
                blocks.extend(self._directions(gi, group, rules[gi], actives[gi], path))
        if blocks:
            self.paths[path.form] += 1
            self.last_path = path
            chain = self.trust.active or any(b.corrected for b in blocks)
            in_chain = self._measure(blocks, chain)  # diagnostics never change the step
            if chain:
                self._chain(blocks, in_chain, path)
            else:  # each rule's own step in its authors' order, then the correction (FedPAC,
                # seed 001: x -= ρ·lr·g_G after the step)
                for block in blocks:
                    block.apply_own_step(1.0 - self.rho)
                    block.add_correction(-self.ref_lr * self.rho)
        if g_hat is not None:
            self._refresh_hessian(g_hat)
        return loss

    def _directions(self, gi: int, group: dict[str, Any], rule: Preconditioner,
                    active: list[torch.Tensor], path: Path) -> list[Block]:
        lr, wd = group["lr"], group["weight_decay"]
        states = [self.state[p] for p in active]
        for st in states:
            st["step"] += 1
        steps = {st["step"] for st in states}
        decay = 0.0 if rule.coupled_decay else lr * wd
        if self.correction == "after-step":  # FedPAC: the local optimizer (and so its decay)
            decay *= 1.0 - self.rho  # runs at lr·(1-ρ); the (1-ρ) of its move is the chain's
        if flat_layout(rule, active, group["params"], steps):
            return [self._flat_block(gi, rule, active, steps.pop(), lr, wd, decay, path)]
        return eager_form.tensor_blocks(rule, active, self.state, steps, lr, wd, decay,
                                        Step(0, self.step_offset, self.mix_lambda, self.bs))

    def _flat_block(self, gi: int, rule: Preconditioner, active: list[torch.Tensor], k: int,
                    lr: float, wd: float, decay: float, path: Path) -> Block:
        """The whole group as one flat vector (an elementwise rule, every parameter active at
        one step count): the rule's direction in the group's `u` buffer, gradients read in place
        where the path lets them stay."""
        g, views = self._flat_grad(gi, active)
        n, like = g.numel(), g
        out = self.work.get(f"u{gi}", n, like)
        bucket = self._bucket(gi, active) if self.bucket_view else None
        grads = cast(list[torch.Tensor], [p.grad for p in active])  # active: the params with a grad
        in_place = path.grads_stay
        if not in_place:
            torch._foreach_copy_(views, grads)
        if rule.coupled_decay and wd:  # coupled L2, as torch.optim.Adam
            g.add_(torch.cat([p.reshape(-1) for p in active], out=self.work.get("x", n, like)),
                   alpha=wd)
        st = self._flat[gi]
        # The rule may fuse u = ρ·Δ_G + (1-ρ)·(lr/L)·d itself (lr/L = 1 unless this group runs
        # at its own lr, as Muon's AdamW half does) and leave that pass to the native loops.
        mix = (1.0 - self.rho) * (lr / self.ref_lr if self.ref_lr else 1.0)
        fusion = Fusion(out, mix, self._scaled_direction(st["global_direction"])
                        if path.fuse_correction else None, defer=path.form == "native")
        if in_place:
            fusion.grads = grads
            fusion.views = {"out": self._views_of(gi, "out", out, active),
                            **{slot: self._views_of(gi, slot, st[slot], active) for slot in rule.slots}}
        d = fused.direction(rule, g, st, Step(k, self.step_offset + k, self.mix_lambda,
                                                         self.bs), fusion)
        eager_form.check_fresh(rule, d.d, st, g)
        return Block(active, d.d, g, lr * d.scale, decay, rule.decay_after,
                     st.get("global_direction"), flat=True, corrected=d.corrected,
                     bucket=bucket, grads=grads if in_place else None, grad_views=views,
                     pending=d.pending)

    def _views_of(self, gi: int, name: str, flat: torch.Tensor, params: list[torch.Tensor]
                  ) -> list[torch.Tensor]:
        """Views of one of the group's flat buffers shaped like its parameters (the same memory
        as `state[p][name]` for a slot), made once per buffer."""
        key = (flat.data_ptr(), flat.numel(), len(params))
        made = self._views.get((gi, name))
        if made is None or made[0] != key:
            views = [v.view_as(p) for v, p in zip(torch.split(flat, [p.numel() for p in params]), params,
                                                  strict=True)]
            self._views[(gi, name)] = made = (key, views)
        return made[1]

    def _scaled_direction(self, direction: torch.Tensor) -> torch.Tensor:
        """ρ·Δ_G, computed once per Δ_G (its version counter tells when it was rewritten)."""
        key = (direction.data_ptr(), direction._version, self.rho)
        if self._scaled_key != key:
            self._scaled = torch.mul(direction, self.rho, out=self.work.get("rho-dg", direction.numel(),
                                                                           direction))
            self._scaled_key = key
        return cast(torch.Tensor, self._scaled)  # computed together with _scaled_key, so set here

    def _chain(self, blocks: list[Block], diagnose: bool, path: Path) -> None:
        """u = (1-ρ)·(c/L)·d + ρ·Δ_G over every active coordinate, modulated, then stepped:
        combine → (the trust rule's own fused passes, where it has them) → modulate → move."""
        if len(blocks) == 1 and blocks[0].flat:  # FedACT's path: everything in place on one vector
            u, g, at_step = self._combine_flat(blocks[0])
        else:
            u, g, at_step = eager_form.combine(blocks, self.ref_lr, self.rho, self.work)
        scale = -self.ref_lr * at_step  # the step's factor of u
        b = blocks[0]
        if path.form == "native":  # FedACT on a CPU: the native loops (step/native.py)
            trust = cast(ACT, self.trust)  # choose_path: the native form is ACT's
            native_form.act_step_(cast(torch.Tensor, b.bucket), u, g, trust.tau, trust.trust_alpha,
                      trust.trust_gamma, scale, b.decay_factor(), self.work, b.grads,
                      b.grad_views, b.pending, adam=path.native_adam)
            return
        b.settle()  # u written, if its pass was left to the trust step
        sizes = [p.numel() for b in blocks for p in b.params]
        phi = self._modulate(b, u, g, sizes, diagnose, scale)
        if len(blocks) == 1 and b.bucket is not None:  # one pass over the flat parameters
            b.move(u, scale, phi)
        elif any(b.decay_after for b in blocks):
            eager_form.move_decaying_after(blocks, u, sizes, phi, self.ref_lr, self.rho)
        else:
            eager_form.move(blocks, u, sizes, phi, scale)

    def _combine_flat(self, b: Block) -> tuple[torch.Tensor, torch.Tensor, float]:
        """u of one flat block, in place in its direction's buffer; (u, g, the factor of u left
        to the step: the scores are scale-invariant, so without correction c/L joins the step)."""
        # corrected: u = ρ·Δ_G + (1-ρ)·(c/L)·d already (the rule fused it); its pass may still
        # be pending, and the trust step below may run it itself
        u = b._d if b.corrected else b.d
        if u is None:
            raise RuntimeError("an elementwise rule's flat step needs a direction; its rule gave none")
        if b.corrected:
            return u, b.g, 1.0
        ratio = b.coef / self.ref_lr if self.ref_lr else 1.0
        if self.rho <= 0.0:  # no correction: the ranking of s = u ⊙ g and the diagnostics do
            return u, b.g, ratio  # not change with a positive factor, applied in the step's pass
        u.mul_((1.0 - self.rho) * ratio)
        if b.global_direction is not None:  # Δ_G = 0 before the first aggregation
            u.add_(b.global_direction, alpha=self.rho)
        return u, b.g, 1.0

    def _modulate(self, b: Block, u: torch.Tensor, g: torch.Tensor, sizes: list[int],
                  diagnose: bool, scale: float) -> torch.Tensor | None:
        """s = u ⊙ g (in g's buffer: g is not read after this), the diagnostics of s, and the
        trust factors -L·φ (the step's factor folded in, so x += φ ⊙ u is one pass); None: no trust."""
        if not (self.trust.active or diagnose):
            return None
        b.fill_g()  # where the gradients stayed in place
        scores = g.mul_(u)
        if diagnose:
            self._record(scores)
        return fused.phi_(self.trust, scores, sizes, self.work, scale=scale) if self.trust.active else None

    def _refresh_hessian(self, g_hat: Mapping[str, torch.Tensor]) -> None:
        """Sophia's h refreshed AFTER use (Liu et al. 2023, Alg. 1; FedMIX-P, seed 002), for the
        parameters ĝ covers."""
        by_name = self._by_name()
        for name, grad in g_hat.items():
            if name not in by_name:  # a parameter outside this optimizer: as torch ignores its grad
                continue
            gi, p = by_name[name]
            rule = self.rule(self.param_groups[gi])
            if rule.needs_loss:
                rule.refresh(self.state[p], grad)
