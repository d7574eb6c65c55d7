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
from adaptfl.local_update.diagnostics import Diagnostics
from adaptfl.local_update.groups import as_groups, build_component
from adaptfl.local_update.modulation import Trust
from adaptfl.local_update.rules import (
    Preconditioner,
    field_default,
    fields_from_group,
    group_values,
    torch_keywords,
)
from adaptfl.local_update.slots import NamedSlots
from adaptfl.local_update.step.choose import Path
from adaptfl.local_update.step.local_step import local_step
from adaptfl.local_update.step.native import Steady
from adaptfl.local_update.workspace import Workspace

CORRECTIONS = ("mix", "after-step")
Tensors = dict[str, torch.Tensor]


def eager(method: Any) -> Any:
    """torch.optim.Optimizer's method without its `torch._disable_dynamo` wrapper, which imports
    torch._dynamo (sympy, triton: ~80 MB and ~1 s of CPU) on its first call. A deployed
    ClientApp is a fresh process per message and never compiles, so it paid that on every
    message (docs/scale.md); in eager mode the wrapper only runs the method."""
    return getattr(method, "__wrapped__", method)


def _same(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    """Two groups' entries equal, value by value; a tensor entry (a tensor lr) never counts as
    unchanged (its comparison is elementwise)."""
    return len(a) == len(b) and all(
        ka == kb and not isinstance(va, torch.Tensor) and not isinstance(vb, torch.Tensor) and va == vb
        for (ka, va), (kb, vb) in zip(a, b, strict=True))


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
        self.steady: Steady | None = None  # FedACT's native step as prepared (step/native.py)
        self.work = Workspace()
        self._rules: dict[tuple[Any, ...], Preconditioner] = {}
        self._rule_of: dict[int, tuple[dict[str, Any], tuple[Any, ...], Preconditioner]] = {}
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
        """The group's rule, rebuilt from its entries (so changing e.g. beta1 there takes effect);
        looked up again only when an entry changed (the step and `hessian_due` ask every step)."""
        entries = tuple((k, v) for k, v in group.items() if k not in ("params", "lr"))  # no rule
        # reads lr, which a scheduler changes every step
        known = self._rule_of.get(id(group))
        if known is not None and known[0] is group and _same(known[1], entries):
            return known[2]
        cls = cast(type[Preconditioner], lookup("preconditioner", group["preconditioner"]))  # as above
        given = fields_from_group(cls, group)
        values = tuple((f.name, given.get(f.name, f.default)) for f in fields_of(cls))
        key = (cls, values)
        if key not in self._rules:
            self._rules[key] = cls(**dict(values))
        self._rule_of[id(group)] = (group, entries, self._rules[key])
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
        """One step (step/local_step.py: `choose_path` picks its form); with `g_hat`, Sophia's h
        is refreshed from it after the step."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        local_step(self, g_hat)
        return loss

    def diagnostics_due(self) -> bool:
        """Whether the step being taken (counted in `steps` already) records PosRatio/TopMass."""
        return self.diagnostics_every > 0 and (
            (self.steps - 1) % self.diagnostics_every == 0 or self._diag_pending)

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
