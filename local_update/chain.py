"""The local update chain: precondition -> correct -> modulate -> step (spec, top of page).

`LocalUpdate` is a thin `torch.optim.Optimizer` shell over the pure rules in
`preconditioners.py` and `trust.py`. It keeps its state as flat vectors over all parameters
(so the global top-k of FedACT is one selection, not one per tensor) and exports / imports
state by parameter NAME (torch's own `state_dict` keys by position).

    g  = ∇F(x)                      (+ wd·x first for coupled-L2 `adam`)
    d  = precondition(g)            sgd: g; adam/adamw: m̂ / (sqrt(v̂) + ε)
    u  = (1-ρ)·d + ρ·Δ_G            correction with the server's global direction
    u  = φ ⊙ u, s = u ⊙ g           trust modulation (act / mgup / cautious)
    x  = (1 - lr·wd)·x - lr·u       decoupled weight decay
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch
from adaptfl.local_update.preconditioners import PRECONDITIONERS, AdamHyper, direction_, new_state
from adaptfl.local_update.trust import TRUST_MODES, modulate_, pos_ratio, top_mass
from adaptfl.local_update.workspace import Workspace


@dataclass(frozen=True)
class LocalUpdateConfig:
    preconditioner: str = "adamw"
    lr: float = 1e-3
    weight_decay: float = 0.0
    adam: AdamHyper = field(default_factory=AdamHyper)
    rho: float = 0.0
    trust: str = "none"
    tau: float = 0.5
    alpha: float = 2.0
    gamma: float = 0.5
    trust_scope: str = "global"
    step_offset: int = 0  # global step t before the first local step
    diagnostics: bool = False  # record PosRatio / TopMass_0.01 at every step

    def __post_init__(self) -> None:
        if self.preconditioner not in PRECONDITIONERS:
            raise ValueError(f"unknown preconditioner {self.preconditioner!r}; "
                             f"known: {PRECONDITIONERS}")
        if not self.lr > 0.0:
            raise ValueError(f"invalid lr={self.lr}: must be > 0")
        if self.weight_decay < 0.0:
            raise ValueError(f"invalid weight-decay={self.weight_decay}: must be >= 0")
        if not 0.0 <= self.rho <= 1.0:
            raise ValueError(f"invalid rho={self.rho}: must be in [0, 1]")
        if self.trust not in TRUST_MODES:
            raise ValueError(f"unknown trust {self.trust!r}; known: {TRUST_MODES}")
        if not 0.0 < self.tau <= 1.0:
            raise ValueError(f"invalid tau={self.tau}: must be in (0, 1]")
        if not self.alpha >= self.gamma > 0.0:
            raise ValueError(f"invalid alpha={self.alpha}, gamma={self.gamma}: need α ≥ γ > 0")
        if self.trust_scope not in ("global", "per-tensor"):
            raise ValueError(f"invalid trust-scope={self.trust_scope!r}: global or per-tensor")
        if self.step_offset < 0:
            raise ValueError(f"invalid step offset {self.step_offset}: must be >= 0")


class LocalUpdate(torch.optim.Optimizer):
    """One client's local optimizer for one round."""

    def __init__(self, named_params: Iterable[tuple[str, torch.nn.Parameter]],
                 cfg: LocalUpdateConfig,
                 delta_g: Mapping[str, torch.Tensor] | None = None) -> None:
        named = list(named_params)
        if not named:
            raise ValueError("LocalUpdate got no parameters")
        self.names = [n for n, _ in named]
        params = [p for _, p in named]
        super().__init__(params, {"lr": cfg.lr})
        self.cfg = cfg
        self.params = params
        self.sizes = [p.numel() for p in params]
        self.offsets = torch.tensor([0] + self.sizes).cumsum(0).tolist()
        self.flat_state = new_state(cfg.preconditioner, sum(self.sizes), params[0].detach())
        self.delta_g = self._flatten(delta_g) if delta_g is not None and cfg.rho > 0 else None
        self.local_step = 0
        self.work = Workspace()  # g, u, s and the selection's masks, reused at every step
        self.pos_ratios: list[float] = []
        self.top_masses: list[float] = []

    # --- state by name -------------------------------------------------------------------
    def _flatten(self, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
        missing = [n for n in self.names if n not in tensors]
        if missing:
            raise ValueError(f"tensors missing for parameters {missing[:5]}")
        like = self.params[0].detach()
        return torch.cat([tensors[n].to(like).reshape(-1) for n in self.names])

    def export_state(self, slot: str) -> dict[str, torch.Tensor]:
        """A copy of one state slot (e.g. `exp_avg_sq`) as {parameter name: tensor}."""
        flat = self.flat_state[slot]
        return {n: flat[a:b].view_as(p).clone()
                for n, p, a, b in zip(self.names, self.params, self.offsets[:-1], self.offsets[1:],
                                      strict=True)}

    def import_state(self, slot: str, tensors: Mapping[str, torch.Tensor]) -> None:
        """Warm-start one state slot from {parameter name: tensor} (shapes must match)."""
        for n, p in zip(self.names, self.params, strict=True):
            if n in tensors and tensors[n].shape != p.shape:
                raise ValueError(f"state {slot}[{n}] has shape {tuple(tensors[n].shape)}, "
                                 f"parameter has {tuple(p.shape)}")
        self.flat_state[slot].copy_(self._flatten(tensors))

    # --- the step ------------------------------------------------------------------------
    def _active(self) -> torch.Tensor | None:
        """Flat indices of the parameters that have a gradient (None: all of them)."""
        if all(p.grad is not None for p in self.params):
            return None
        idx = [torch.arange(a, b) for p, a, b in zip(self.params, self.offsets[:-1],
                                                     self.offsets[1:], strict=True)
               if p.grad is not None]
        return torch.cat(idx).to(self.params[0].device) if idx else None

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[no-untyped-def, override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        active = [p for p in self.params if p.grad is not None]
        if not active:
            return loss
        sel = self._active()
        self.local_step += 1
        k, t = self.local_step, self.cfg.step_offset + self.local_step
        cfg = self.cfg
        like, n = active[0].detach(), sum(p.numel() for p in active)
        g = torch.cat([p.grad.reshape(-1) for p in active], out=self.work.get("g", n, like))
        if cfg.preconditioner == "adam" and cfg.weight_decay:  # coupled L2, as torch.optim.Adam
            x = torch.cat([p.reshape(-1) for p in active], out=self.work.get("u", n, like))
            g.add_(x, alpha=cfg.weight_decay)
        state = {s: (v if sel is None else v[sel]) for s, v in self.flat_state.items()}
        u = direction_(cfg.preconditioner, state, g, cfg.adam, k, t, out=self.work.get("u", n, like))
        if sel is not None:
            for s, v in state.items():
                self.flat_state[s][sel] = v
        if cfg.rho > 0.0:  # u = (1-ρ)·d + ρ·Δ_G, with Δ_G = 0 before the first aggregation (Alg. 1)
            u.mul_(1.0 - cfg.rho)
            if self.delta_g is not None:
                u.add_(self.delta_g if sel is None else self.delta_g[sel], alpha=cfg.rho)
        self._modulate(u, g, [p.numel() for p in active])
        decay = 0.0 if cfg.preconditioner == "adam" else cfg.lr * cfg.weight_decay
        if decay:
            torch._foreach_mul_(active, 1.0 - decay)
        steps = [v.view_as(p) for v, p in zip(u.split([p.numel() for p in active]), active,
                                                strict=True)]
        torch._foreach_add_(active, steps, alpha=-cfg.lr)
        return loss

    def _modulate(self, u: torch.Tensor, g: torch.Tensor, sizes: list[int]) -> None:
        cfg = self.cfg
        if cfg.trust == "none" and not cfg.diagnostics:
            return
        scores = g.mul_(u)  # s = u ⊙ g, in place: g is not needed after this (g ⊙ u ≡ u ⊙ g)
        if cfg.diagnostics:
            self.pos_ratios.append(pos_ratio(scores, self.work))
            self.top_masses.append(top_mass(scores, ws=self.work))
        modulate_(u, g, cfg.trust, cfg.tau, cfg.alpha, cfg.gamma, sizes,
                  per_tensor=cfg.trust_scope == "per-tensor", scores=scores, ws=self.work)
