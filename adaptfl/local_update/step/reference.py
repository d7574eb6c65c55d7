"""One local step of the elementwise rules (sgd, adam, adamw, sophia) over C clients, as the
papers write it; FedACT's whole step (seed 000, Algorithm 1, lines 9-16) is `elementwise_step`
with AdamW, the global direction and `act`:

    m = β1·m + (1-β1)·g;  v = β2·v + (1-β2)·g²          (v warm-started from the server's v̄)
    d = m̂ / (sqrt(v̂) + ε)                               m̂ on the local step k, v̂ on t = (r-1)K + k
    u = (1-ρ)·d + ρ·Δ_G                                  correction (Eq. 6)
    s = u ⊙ g;  φ = α on the top ⌊τD⌋ of s, γ elsewhere  trust modulation (Eq. 7-8)
    x = (1 - lr·wd)·x - lr·φ ⊙ u                         decoupled decay, then the step

Shapes: x, g and every state slot are [C, D], one row per client, D the flat length of the
group's parameters in `named_parameters()` order; Δ_G may be [1, D] (the same for every client).
Out of place throughout: the inputs are never written.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from adaptfl.local_update.modulation import ACT, MGUP, Cautious, NoTrust, Trust
from adaptfl.local_update.rules import Preconditioner, Step, sophia
from adaptfl.local_update.rules.adam import Adam, AdamW, bias_steps
from adaptfl.local_update.rules.sgd import SGD
from adaptfl.local_update.rules.sophia import Sophia
from adaptfl.local_update.step.selection import segment_top_k_mask

State = dict[str, torch.Tensor]  # slot (torch's names: exp_avg, exp_avg_sq, hessian, …) -> [C, D]
Direction = tuple[torch.Tensor, float, State]  # (d [C, D], the factor c/lr of its step, new state)


@dataclass(frozen=True)
class Chain:
    """What follows the direction, as `LocalUpdate` holds it for one param group."""

    lr: float  # this group's lr: the rule's step is lr·scale
    weight_decay: float
    ref_lr: float  # L, the optimizer's reference lr (the first group's): u and φ are in its units
    rho: float = 0.0  # weight of the global direction Δ_G
    correction: str = "mix"  # "after-step" (FedPAC): the local optimizer, its decay too, at lr·(1-ρ)
    trust: Trust = NoTrust()
    sizes: tuple[int, ...] = ()  # the group's tensors' lengths (per-tensor trust scopes)
    fast_selection: bool = False  # the top-k by `rows_top_k_mask` (the same set, no sort)


# --- directions ---------------------------------------------------------------------------

def sgd_direction(rule: SGD, g: torch.Tensor, state: State, at: Step) -> Direction:
    """d = g."""
    return g, 1.0, state


def adam_direction(rule: AdamW, g: torch.Tensor, state: State, at: Step) -> Direction:
    """d = m̂ / (sqrt(v̂) + ε), the corrections on the step counts `bias_correction` names."""
    m = rule.beta1 * state["exp_avg"] + (1.0 - rule.beta1) * g
    v = rule.beta2 * state["exp_avg_sq"] + (1.0 - rule.beta2) * g * g
    n_m, n_v = bias_steps(rule.bias_correction, at.k, at.t)
    m_hat = m / (1.0 - rule.beta1**n_m) if n_m else m
    v_hat = v / (1.0 - rule.beta2**n_v) if n_v else v
    return m_hat / (v_hat.sqrt() + rule.eps), 1.0, {**state, "exp_avg": m, "exp_avg_sq": v}


def sophia_direction(rule: Sophia, g: torch.Tensor, state: State, at: Step) -> Direction:
    """d = clip(m / max(ρ_s·bs·h̃, 1e-15), -1, 1), h̃ = (1-λ)·h^r + λ·h (FedMIX-P's mix): the
    rule's own formula (rules/sophia.py, written once), on a copy of m."""
    m = state["exp_avg"].clone()
    d = sophia.sophia_direction(g, m, state["hessian"], rule.sophia_beta1, rule.sophia_rho, at.bs,
                                state.get("ref_hessian"), at.lam)
    return d, 1.0, {**state, "exp_avg": m}


def refresh_hessian(rule: Preconditioner, state: State, g_hat: torch.Tensor) -> State:
    """Sophia's h = β2·h + (1-β2)·ĝ², after the step that used h (ĝ: the GNB gradient): the
    rule's own formula, on a copy of h."""
    if not isinstance(rule, Sophia):
        raise TypeError(f"local rule {rule.name!r} refreshes nothing from a second gradient")
    h = state["hessian"].clone()
    sophia.hessian_update_(h, g_hat, rule.sophia_beta2)
    return {**state, "hessian": h}


DIRECTIONS: dict[type, Callable[..., Direction]] = {
    SGD: sgd_direction, AdamW: adam_direction, Adam: adam_direction, Sophia: sophia_direction}


def direction(rule: Preconditioner, g: torch.Tensor, state: State, at: Step) -> Direction:
    """The rule's direction of this step (by its exact class: a subclass may change the math)."""
    return DIRECTIONS[type(rule)](rule, g, state, at)


# --- correction, trust, step ---------------------------------------------------------------

def correct(d: torch.Tensor, ratio: float, rho: float, global_direction: torch.Tensor | None
            ) -> torch.Tensor:
    """u = (1-ρ)·(c/L)·d + ρ·Δ_G; before the server has a Δ_G, u = (1-ρ)·(c/L)·d."""
    u = d if (1.0 - rho) * ratio == 1.0 else (1.0 - rho) * ratio * d
    return u if global_direction is None or rho == 0.0 else u + rho * global_direction


def modulate(scores: torch.Tensor, chain: Chain) -> torch.Tensor | None:
    """φ [C, D] from the trust scores s = u ⊙ g; None where the rule does not modulate."""
    trust = chain.trust
    if isinstance(trust, ACT | MGUP):
        per_tensor = isinstance(trust, MGUP) or trust.trust_scope == "per-tensor"
        trusted = segment_top_k_mask(scores, trust.tau, chain.sizes if per_tensor else None,
                                     fast=chain.fast_selection)
        alpha, gamma = scores.new_tensor(trust.trust_alpha), scores.new_tensor(trust.trust_gamma)
        return torch.where(trusted, alpha, gamma)
    if isinstance(trust, Cautious):  # 1[s > 0] rescaled by D / (nnz + 1), per client
        positive = scores > 0
        factor = scores.shape[1] / (positive.sum(dim=1, keepdim=True) + 1).to(torch.float64)
        return positive.to(scores.dtype) * factor.to(scores.dtype)
    return None


def decay_rate(rule: Preconditioner, chain: Chain) -> float:
    """δ of x = (1-δ)·x: lr·wd, none for coupled L2 (Adam), times (1-ρ) after FedPAC's step."""
    if rule.coupled_decay:
        return 0.0
    share = 1.0 - chain.rho if chain.correction == "after-step" else 1.0
    return chain.lr * chain.weight_decay * share


def move(x: torch.Tensor, u: torch.Tensor, phi: torch.Tensor | None, ref_lr: float,
         decay: float) -> torch.Tensor:
    """x = (1-δ)·x - L·φ ⊙ u (φ = 1 without trust)."""
    step = u if phi is None else phi * u
    return x.mul(1.0 - decay).sub_(step, alpha=ref_lr)  # a new tensor: x itself is not written


def elementwise_step(rule: Preconditioner, x: torch.Tensor, g: torch.Tensor, state: State,
                     at: Step, chain: Chain, scores: bool = True
                     ) -> tuple[torch.Tensor, State, torch.Tensor | None]:
    """(x', state', s = u ⊙ g) of one local step of every client: direction, correction,
    trust, step. `at.k`, `at.t`: the local and global step (the same for every client).
    `scores`: return s even where no trust rule reads it (the diagnostics do); else None."""
    if rule.coupled_decay and chain.weight_decay:  # Adam's L2: g += wd·x before the rule
        g = g + chain.weight_decay * x
    d, scale, state = direction(rule, g, state, at)
    ratio = chain.lr * scale / chain.ref_lr if chain.ref_lr else 1.0
    u = correct(d, ratio, chain.rho, state.get("global_direction"))
    s = u * g if scores or chain.trust.active else None
    x = move(x, u, None if s is None else modulate(s, chain), chain.ref_lr, decay_rate(rule, chain))
    return x, state, s


def supports(rule: Preconditioner, trust: Trust) -> bool:
    """Whether this reference has the rule's and the trust rule's math (exact classes)."""
    return type(rule) in DIRECTIONS and type(trust) in (NoTrust, ACT, MGUP, Cautious)
