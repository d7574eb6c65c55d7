"""Named algorithms as recipes over the composable local update, plus a server rule.

A preset fixes the *structure* (which preconditioner, whether Δ_G correction, trust modulation
and second-moment sync are on) and the default lr / weight decay; the numeric hyperparameters
(ρ, τ, α, γ, β1, β2, …) come from the run config. `preconditioner=` and `trust=` in the run
config override the preset's choice, so any combination the pieces allow can be run.
"""

from __future__ import annotations

from dataclasses import dataclass

from algorithms.config import PRESET, RunConfig


@dataclass(frozen=True)
class Preset:
    preconditioner: str  # "sgd" | "adam" (coupled L2) | "adamw" (decoupled wd)
    correction: bool  # u = (1-ρ)d + ρΔ_G; False forces ρ = 0 and Δ_G is never sent
    trust: str  # "none" | "act" | "cautious" | "mgup"
    v_sync: bool  # warm-start v from v̄ and upload v; False forces v-sync = "none"
    bias_correction: str  # "paper" | "single-counter" | "local" | "off"
    lr: float  # default local lr (FMNIST CNN main job; the papers tune per model)
    weight_decay: float
    server: str  # strategy name in strategies/ ("fedavg" | "fedact")
    paper: str


# lr defaults: SGD 0.1 and wd 1e-3 as FedACT's Table 6; the adaptive family uses 1e-3 (Table 6
# tunes 1e-4..1e-3 for Transformers; 1e-3 reaches a useful accuracy within the short main job).
PRESETS: dict[str, Preset] = {
    "fedavg": Preset("sgd", False, "none", False, "off", 0.1, 1e-3, "fedavg",
                     "McMahan et al. 2017"),
    "localadam": Preset("adam", False, "none", False, "local", 1e-3, 1e-3, "fedavg",
                        "local Adam, FedAvg of models"),
    "localadamw": Preset("adamw", False, "none", False, "local", 1e-3, 0.01, "fedavg",
                         "local AdamW, FedAvg of models"),
    "fedadamw": Preset("adamw", True, "none", True, "paper", 1e-3, 0.01, "fedact",
                       "Liu et al. 2026 (FedAdamW)"),
    "fedact": Preset("adamw", True, "act", True, "paper", 1e-3, 0.01, "fedact",
                     "seed 000 (FedACT)"),
    "fedact-local": Preset("adamw", False, "act", True, "paper", 1e-3, 0.01, "fedact",
                           "seed 000, ρ=0 ablation"),
}


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ValueError(f"unknown algorithm {name!r}; known: {sorted(PRESETS)}")
    return PRESETS[name]


@dataclass(frozen=True)
class Resolved:
    """The run config with every preset decision made: what the server and clients run."""

    algorithm: str
    server: str
    preconditioner: str
    trust: str
    rho: float
    v_sync: str
    bias_correction: str
    lr: float
    weight_decay: float


def resolve(cfg: RunConfig) -> Resolved:
    preset = get_preset(cfg.algorithm)
    preconditioner = preset.preconditioner if cfg.preconditioner == PRESET else cfg.preconditioner
    trust = preset.trust if cfg.trust == PRESET else cfg.trust
    bias = preset.bias_correction if cfg.bias_correction == PRESET else cfg.bias_correction
    v_sync = cfg.v_sync if preset.v_sync else "none"
    if preconditioner == "sgd" and v_sync != "none":
        raise ValueError(f"algorithm {cfg.algorithm!r} with preconditioner='sgd' has no second "
                         "moment to sync; choose an adaptive preconditioner")
    if v_sync != "none" and bias == "local":
        raise ValueError("bias-correction='local' restarts the v correction every round, which "
                         "contradicts a synced v; use 'paper' or 'single-counter'")
    return Resolved(
        algorithm=cfg.algorithm,
        server=preset.server,
        preconditioner=preconditioner,
        trust=trust,
        rho=cfg.rho if preset.correction else 0.0,
        v_sync=v_sync,
        bias_correction=bias,
        lr=cfg.lr if cfg.lr > 0.0 else preset.lr,
        weight_decay=cfg.weight_decay if cfg.weight_decay >= 0.0 else preset.weight_decay,
    )
