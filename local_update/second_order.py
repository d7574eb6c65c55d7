"""The local update for the second-order preconditioners: Sophia, Muon, SOAP (spec §2-4).

Design: `LocalUpdate` (chain.py) keeps flat vectors over all parameters, which suits diagonal
rules and FedACT's global top-k. Muon and SOAP need per-matrix state (a momentum matrix, one
Kronecker factor per mode), so this is a separate thin shell with per-tensor state over the pure
rules in sophia.py / muon.py / soap.py. It runs the same chain at every step:

    d   = precondition(g)               per tensor, with the mixed reference (FedMIX-P, λ)
    u   = (1-ρ)·(lr_p/lr)·d + ρ·Δ_G     FedPAC: lr_loc = (1-β)·lr and x -= β·lr·g_G (ρ = β)
    u   = φ ⊙ u                         trust modulation (refused on Muon's orthogonalised d
                                        unless `trust_on_muon`)
    x   = (1 - (1-ρ)·lr_wd·wd)·x - lr·u (SOAP applies the decay after the step, as its authors)

and exports / imports Θ by parameter name (theta.py) so the server can average it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch
from adaptfl.local_update.muon import muon_direction, shape_scale
from adaptfl.local_update.preconditioners import AdamHyper, adam_direction_
from adaptfl.local_update.routing import route_muon
from adaptfl.local_update.soap import (
    eigenbasis,
    mixed_factors,
    new_factors,
    refresh_basis,
    soap_direction,
    update_factors_,
)
from adaptfl.local_update.sophia import hessian_update_, sophia_direction, sophia_refresh_due
from adaptfl.local_update.theta import SECOND_ORDER
from adaptfl.local_update.trust import TRUST_MODES, modulate_


@dataclass(frozen=True)
class SecondOrderConfig:
    optimizer: str = "soap"  # "sophia" | "muon" | "soap"
    lr: float = 3e-3
    weight_decay: float = 0.01
    beta1: float = 0.95  # Sophia β1 / SOAP β1 / Muon's momentum β
    beta2: float = 0.95  # Sophia β2 / SOAP β2
    eps: float = 1e-8  # SOAP
    sophia_rho: float = 0.04  # ρ_s
    hessian_interval: int = 10  # k_h
    adam_lr: float = 3e-4  # Muon's AdamW part
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    adam_eps: float = 1e-10
    routing: str = "hidden"
    shampoo_beta: float = 0.95
    precondition_frequency: int = 10  # f
    max_precond_dim: int = 10000
    lam: float = 1.0  # λ of FedMIX-P (1: own state only)
    rho: float = 0.0  # correction weight (FedPAC's β)
    trust: str = "none"
    tau: float = 0.5
    alpha: float = 2.0
    gamma: float = 0.5
    trust_scope: str = "global"
    trust_on_muon: bool = False

    def __post_init__(self) -> None:
        if self.optimizer not in SECOND_ORDER:
            raise ValueError(f"unknown second-order optimizer {self.optimizer!r}; known: {SECOND_ORDER}")
        for name in ("lr", "adam_lr", "eps", "adam_eps"):
            if not getattr(self, name) > 0.0:
                raise ValueError(f"invalid {name}={getattr(self, name)}: must be > 0")
        for name in ("beta1", "beta2", "adam_beta1", "adam_beta2", "shampoo_beta"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"invalid {name}={getattr(self, name)}: must be in [0, 1)")
        if self.weight_decay < 0.0 or self.sophia_rho <= 0.0:
            raise ValueError(f"invalid weight_decay={self.weight_decay} or sophia_rho="
                             f"{self.sophia_rho}: need wd >= 0, ρ_s > 0")
        for name in ("hessian_interval", "precondition_frequency", "max_precond_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"invalid {name}={getattr(self, name)}: must be >= 1")
        if not 0.0 <= self.lam <= 1.0 or not 0.0 <= self.rho < 1.0:
            raise ValueError(f"invalid lam={self.lam} / rho={self.rho}: need λ in [0,1], ρ in [0,1)")
        if self.trust not in TRUST_MODES:
            raise ValueError(f"unknown trust {self.trust!r}; known: {TRUST_MODES}")
        if self.optimizer == "muon" and self.trust != "none" and not self.trust_on_muon:
            raise ValueError(f"trust={self.trust!r} on Muon scales coordinates of an orthogonalised "
                             "update and breaks its orthogonality; set trust-on-muon=true to opt in")


class SecondOrderUpdate(torch.optim.Optimizer):
    """One client's Sophia / Muon / SOAP for one round; Θ by parameter name."""

    def __init__(self, named_params: Iterable[tuple[str, torch.nn.Parameter]], cfg: SecondOrderConfig,
                 reference: Mapping[str, torch.Tensor] | None = None,
                 delta_g: Mapping[str, torch.Tensor] | None = None) -> None:
        named = list(named_params)
        if not named:
            raise ValueError("SecondOrderUpdate got no parameters")
        super().__init__([p for _, p in named], {"lr": cfg.lr})
        self.cfg, self.named = cfg, named
        self.muon = set(route_muon([(n, p.shape) for n, p in named], cfg.routing)) \
            if cfg.optimizer == "muon" else set()
        self.reference = dict(reference) if reference else None  # Θ^r, frozen for the round
        self.delta_g = dict(delta_g) if delta_g is not None and cfg.rho > 0 else None
        self.local_step = 0
        self.bs = 1  # examples (tokens) in the current batch: Sophia's bs
        for n, p in named:
            self.state[p].update(self._fresh(n, p))
        if self.reference is not None:
            self.import_theta(self.reference)

    def _fresh(self, name: str, p: torch.Tensor) -> dict:
        z = torch.zeros_like(p)
        if self.cfg.optimizer == "sophia":
            return {"exp_avg": z, "hessian": torch.zeros_like(p)}
        if self.cfg.optimizer == "muon":
            return {"momentum_buffer": z} if name in self.muon else \
                {"exp_avg": z, "exp_avg_sq": torch.zeros_like(p), "step": 0}
        return {"exp_avg": z, "exp_avg_sq": torch.zeros_like(p), "step": 0, "basis": None,
                "gg": new_factors(p.shape, self.cfg.max_precond_dim, p.detach())}

    # --- Θ by name ---------------------------------------------------------------------------
    def export_theta(self) -> dict[str, torch.Tensor]:
        out = {}
        for n, p in self.named:
            st = self.state[p]
            if self.cfg.optimizer == "soap":
                out.update({f"{n}/gg{i}": gg.clone() for i, gg in enumerate(st["gg"])
                            if gg is not None and p.ndim >= 2})
            elif "hessian" in st or "momentum_buffer" in st:
                slot = "hessian" if "hessian" in st else "momentum_buffer"
                out[f"{n}/{slot}"] = st[slot].clone()
        return out

    def import_theta(self, theta: Mapping[str, torch.Tensor]) -> None:
        """Warm start (FedPAC alignment): copy Θ^r into the client's own state."""
        own = self.export_theta()
        unknown = sorted(set(theta) - set(own))
        if unknown:
            raise ValueError(f"Θ has entries this model lacks: {unknown[:5]}")
        for n, p in self.named:
            st = self.state[p]
            for key in [k for k in own if k.startswith(n + "/") and k in theta]:
                slot, src = key[len(n) + 1:], theta[key]
                if src.shape != own[key].shape:
                    raise ValueError(f"Θ[{key}] has shape {tuple(src.shape)}, expected "
                                     f"{tuple(own[key].shape)}")
                dst = st["gg"][int(slot[2:])] if slot.startswith("gg") else st[slot]
                dst.copy_(src)
                st["warm"] = True

    def _ref(self, name: str, slot: str) -> torch.Tensor | None:
        return None if self.reference is None else self.reference.get(f"{name}/{slot}")

    # --- the step ------------------------------------------------------------------------------
    def hessian_due(self) -> bool:
        """Whether the coming step refreshes Sophia's h (the caller then passes ĝ to `step`)."""
        return self.cfg.optimizer == "sophia" and \
            sophia_refresh_due(self.local_step + 1, self.cfg.hessian_interval)

    @torch.no_grad()
    def step(self, closure=None, g_hat: Mapping[str, torch.Tensor] | None = None):  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.local_step += 1
        cfg, lr = self.cfg, self.cfg.lr
        active, ds, coefs, decays = [], [], [], []
        for n, p in self.named:
            if p.grad is None:
                continue
            d, lr_p, lr_wd = self._direction(n, p, p.grad)
            if d is None:  # SOAP's initialising first step: no move
                continue
            active.append((n, p))
            ds.append(d)
            coefs.append((1.0 - cfg.rho) * lr_p)  # x -= lr_loc·d with lr_loc = (1-ρ)·lr_p
            decays.append((1.0 - cfg.rho) * lr_wd * cfg.weight_decay)
        if self.delta_g is not None or cfg.trust != "none":
            # u = (1-ρ)·(lr_p/lr)·d + ρ·Δ_G, modulated, then x -= lr·u
            for (n, _), d, c in zip(active, ds, coefs, strict=True):
                d.mul_(c / lr)
                if self.delta_g is not None:
                    d.add_(self.delta_g[n].to(d), alpha=cfg.rho)
            self._modulate(ds, [p.grad for _, p in active])
            coefs = [lr] * len(ds)
        for (_, p), d, c, decay in zip(active, ds, coefs, decays, strict=True):
            if cfg.optimizer == "soap":  # decay after the step, as SOAP's authors
                p.add_(d, alpha=-c).mul_(1.0 - decay)
            else:
                p.mul_(1.0 - decay).add_(d, alpha=-c)
        if g_hat is not None and cfg.optimizer == "sophia":  # h refreshed AFTER use (spec §4)
            for n, p in self.named:
                if n in g_hat:
                    hessian_update_(self.state[p]["hessian"], g_hat[n], cfg.beta2)
        return loss

    def _direction(self, n: str, p: torch.Tensor, g: torch.Tensor
                   ) -> tuple[torch.Tensor | None, float, float]:
        """(d, the lr it is stepped with, the lr its weight decay uses)."""
        cfg, st = self.cfg, self.state[p]
        if cfg.optimizer == "sophia":
            d = sophia_direction(g, st["exp_avg"], st["hessian"], cfg.beta1, cfg.sophia_rho,
                                 self.bs, self._ref(n, "hessian"), cfg.lam)
            return d, cfg.lr, cfg.lr
        if cfg.optimizer == "muon":
            if n in self.muon:
                o = muon_direction(g, st["momentum_buffer"], cfg.beta1,
                                   self._ref(n, "momentum_buffer"), cfg.lam)
                return o.to(p.dtype), cfg.lr * shape_scale(p.shape), cfg.lr
            st["step"] += 1
            hp = AdamHyper(cfg.adam_beta1, cfg.adam_beta2, cfg.adam_eps, "local")
            return adam_direction_(st["exp_avg"], st["exp_avg_sq"], g, hp, st["step"], st["step"]), \
                cfg.adam_lr, cfg.adam_lr
        return self._soap(n, p, g)

    def _soap(self, n: str, p: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor | None, float, float]:
        cfg, st = self.cfg, self.state[p]
        mix = None
        if self.reference is not None and cfg.lam < 1.0:
            def mix(i: int, gg: torch.Tensor) -> torch.Tensor:  # (1-λ)·gg^r + λ·gg
                ref = self._ref(n, f"gg{i}")
                return gg if ref is None else torch.lerp(ref.to(gg), gg, cfg.lam)
        if st["basis"] is None:
            if not st.get("warm"):  # fresh: the first step only initialises gg and Q
                update_factors_(st["gg"], g, cfg.shampoo_beta)
                st["basis"] = eigenbasis(st["gg"])
                return None, cfg.lr, cfg.lr
            st["basis"] = eigenbasis(mixed_factors(st["gg"], mix))  # warm: Q from Θ^r, full step
        st["step"] += 1
        k = st["step"]
        d = soap_direction(g, st["exp_avg"], st["exp_avg_sq"], st["basis"], cfg.beta1, cfg.beta2, cfg.eps)
        size = math.sqrt(1.0 - cfg.beta2**k) / (1.0 - cfg.beta1**k)
        update_factors_(st["gg"], g, cfg.shampoo_beta)  # AFTER use (used only from the next basis)
        if k % cfg.precondition_frequency == 0:
            st["basis"], st["exp_avg_sq"] = refresh_basis(mixed_factors(st["gg"], mix), st["basis"],
                                                          st["exp_avg_sq"])
        return d, cfg.lr * size, cfg.lr

    def _modulate(self, us: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
        cfg = self.cfg
        if cfg.trust == "none" or not us:
            return
        u = torch.cat([x.reshape(-1) for x in us])
        g = torch.cat([x.reshape(-1).to(u) for x in grads])
        modulate_(u, g, cfg.trust, cfg.tau, cfg.alpha, cfg.gamma, [x.numel() for x in us],
                  per_tensor=cfg.trust_scope == "per-tensor")
        for dst, src in zip(us, u.split([x.numel() for x in us]), strict=True):
            dst.copy_(src.view_as(dst))
