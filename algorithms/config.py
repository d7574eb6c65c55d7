"""The run config, converted once at the edge into a typed, validated, frozen object.

Keys are kebab-case in `pyproject.toml` / `--run-config` and snake_case attributes here; the
name is otherwise unchanged all the way to the math (`rho` in config, recipe and update rule).
Sentinels (documented per field) mean "the algorithm preset decides".
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

PRESET = "preset"  # string sentinel: the preset of `algorithm` decides


@dataclass(frozen=True)
class RunConfig:
    algorithm: str = "fedact"
    num_server_rounds: int = 20
    fraction_train: float = 1.0  # share of the connected nodes sampled per round
    min_replies: int = 1  # below this many accepted replies the round leaves state unchanged
    local_steps: int = 50  # K
    batch_size: int = 50
    lr: float = 0.0  # local learning rate at round 1; 0 = the preset's default
    lr_schedule: str = "cosine"  # "cosine" (to 0 over the rounds) or "constant"
    weight_decay: float = -1.0  # -1 = the preset's default
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    rho: float = 0.5  # weight of the global direction Δ_G in u = (1-ρ)d + ρΔ_G
    tau: float = 0.5  # trust ratio: top ⌊τD⌋ coordinates get α
    alpha: float = 0.0  # 0 = 1/τ (MGUP-style default)
    gamma: float = 0.0  # 0 = τ
    preconditioner: str = PRESET  # "sgd" | "adam" | "adamw"
    trust: str = PRESET  # "none" | "act" | "cautious" | "mgup"
    trust_scope: str = "global"  # "global" (top-k over all D) | "per-tensor"
    v_sync: str = "full"  # "full" | "block" | "none" (presets without sync force "none")
    bias_correction: str = PRESET  # "paper" | "single-counter" | "local" | "off"
    weighting: str = "examples"  # mean over replies: "examples" (sample count) | "uniform"
    # --- server optimizer (strategies/server_opt.py), composable with any client recipe ---
    server_opt: str = PRESET  # "none" | "avgm" | "adam" | "yogi" | "adagrad" | "adamom"
    eta: float = 0.0  # server learning rate η; 0 = the preset's default
    server_momentum: float = 0.9  # FedAvgM's β (Flower: server_momentum)
    server_beta1: float = 0.9  # FedAdam / FedYogi β1 (Flower: beta_1)
    server_beta2: float = 0.99  # FedAdam / FedYogi β2 (Flower: beta_2)
    server_tau: float = 1e-3  # FedAdam / FedYogi / FedAdagrad adaptivity τ (Flower: tau)
    b2: float = 0.05  # FedAdamom: weight of the old v in v = b2·v + (1-b2)·Δ² (seed 004)
    adamom_eps: float = 1e-3  # FedAdamom: β1 = clip(1 - v/v̄, 0, 1-ε)
    # --- client-side terms (client_app/terms.py) ---
    mu: float = -1.0  # HaFedHo / FedProx / MOON weight μ; -1 = the preset's default
    rectify: str = "objective"  # HaFedHo: "objective" (term in the loss) | "gradient" (μh on ∇)
    dyn_alpha: float = 0.01  # FedDyn's α (dynamic regulariser weight)
    moon_tau: float = 0.5  # MOON's temperature τ of the contrastive loss
    gamma_l: float = 0.9  # FedLADA's global offset weight γ_l (its ρ)
    cm_alpha: float = 0.1  # FedCM's α: weight of the local gradient (ρ = 1 - α)
    client_state_dir: str = ""  # durable client state (HaFedHo, SCAFFOLD, …); "" = <tmp>/adaptfl-client-state
    task: str = "fashion-mnist"
    model: str = "cnn"
    partitioning: str = "dirichlet"  # "dirichlet" | "iid" | "pathological" | "natural-id"
    dirichlet_alpha: float = 0.3
    classes_per_client: int = 2  # "pathological": labels per client (workloads/partitioning.py)
    data_dir: str = ""
    results_dir: str = ""  # "" = <project>/results (see server_app/outputs.py)
    run_name: str = ""  # "" = <algorithm>-<timestamp>
    seed: int = 42
    device: str = "auto"  # "auto" | "cpu" | "cuda" | "cuda:N" (a node config may override)
    num_threads: int = 0  # torch threads in each client process; 0 = leave torch's default
    round_timeout: float = 0.0  # seconds to wait for replies; 0 = no limit
    max_reply_mb: float = 1024.0  # replies larger than this are dropped
    resume: bool = False  # continue results-dir/run-name from its last checkpointed round
    resume_from: str = ""  # absolute path of an earlier run's results dir to continue from
    # --- second-order local optimizers, FedPAC, FedMIX-P (spec §2-4; local_update/second_order.py) ---
    sophia_rho: float = 0.04  # Sophia's ρ_s in clip(m / max(ρ_s·bs·h, 1e-15))
    sophia_beta1: float = 0.965
    sophia_beta2: float = 0.99
    hessian_interval: int = 10  # Sophia's k_h: GNB Hessian refresh every k_h local steps
    muon_momentum: float = 0.95  # Muon's β
    muon_adam_lr: float = 3e-4  # AdamW lr of the parameters Muon does not manage (same schedule)
    muon_routing: str = "hidden"  # "hidden" (Muon's authors) | "all-2d" (FedPAC's code)
    trust_on_muon: bool = False  # explicit opt-in for per-coordinate trust on Muon's update
    soap_beta1: float = 0.95
    soap_beta2: float = 0.95
    shampoo_beta: float = 0.95  # EMA of SOAP's Kronecker statistics
    precondition_frequency: int = 10  # SOAP's f: power iteration + QR every f steps
    max_precond_dim: int = 10000  # SOAP modes larger than this stay unrotated
    fedpac_beta: float = 0.5  # FedPAC's β: lr_loc = (1-β)·lr, x -= β·lr·g_G after each step
    mix_lambda: float = 0.5  # FedMIX-P's λ (λ0 or c of the schedules)
    lambda_schedule: str = "constant"  # "constant" | "lambda0-sqrt-r" (λ0/√r) | "c-sqrt-R" (c/√R)
    light: bool = False  # fedpac-light: low-rank / block-mean upload of Θ (FedPAC, FedMIX-P)
    light_c: float = 0.1  # light rank fraction c (Muon r = ⌊c·m·n/(m+n+1)⌋, SOAP r = ⌈c·d⌉)

    @classmethod
    def from_flower(cls, run_config: Mapping[str, Any]) -> RunConfig:
        """Build from Flower's run config (kebab-case); unknown or missing keys raise."""
        by_key = {f.name.replace("_", "-"): f for f in fields(cls)}
        unknown = sorted(set(run_config) - set(by_key))
        if unknown:
            raise ValueError(f"unknown run-config keys {unknown}; known: {sorted(by_key)}")
        missing = sorted(set(by_key) - set(run_config))
        if missing:
            raise ValueError(f"run-config keys missing: {missing}")
        values = {f.name: _coerce(key, run_config[key], f.type) for key, f in by_key.items()}
        return cls(**values)

    def to_flower(self) -> dict[str, Any]:
        return {f.name.replace("_", "-"): getattr(self, f.name) for f in fields(self)}

    @property
    def trust_alpha(self) -> float:
        return self.alpha if self.alpha > 0.0 else 1.0 / self.tau

    @property
    def trust_gamma(self) -> float:
        return self.gamma if self.gamma > 0.0 else self.tau

    def replace(self, **changes: Any) -> RunConfig:
        return dataclasses.replace(self, **changes)

    def __post_init__(self) -> None:
        _validate(self)


def _coerce(key: str, value: Any, type_name: Any) -> Any:
    """Flower parses `lr=1` as int; accept ints for floats, reject everything else."""
    expected = {"int": int, "float": float, "str": str, "bool": bool}[str(type_name)]
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if expected is bool:  # bool is an int subclass: only real booleans pass
        if not isinstance(value, bool):
            raise ValueError(f"run-config {key}={value!r}: expected bool (true/false)")
        return value
    if not isinstance(value, expected) or isinstance(value, bool):
        raise ValueError(f"run-config {key}={value!r}: expected {expected.__name__}")
    return value


_CHOICES = {
    "lr_schedule": {"cosine", "constant"},
    "preconditioner": {PRESET, "sgd", "adam", "adamw", "sophia", "muon", "soap"},
    "trust": {PRESET, "none", "act", "cautious", "mgup"},
    "trust_scope": {"global", "per-tensor"},
    "v_sync": {"full", "block", "none"},
    "bias_correction": {PRESET, "paper", "single-counter", "local", "off"},
    "weighting": {"examples", "uniform"},
    "server_opt": {PRESET, "none", "avgm", "adam", "yogi", "adagrad", "adamom"},
    "rectify": {"objective", "gradient"},
    "partitioning": {"dirichlet", "iid", "pathological", "natural-id"},
    "muon_routing": {"hidden", "all-2d"},
    "lambda_schedule": {"constant", "lambda0-sqrt-r", "c-sqrt-R"},
}


def _check(ok: bool, name: str, value: Any, why: str) -> None:
    if not ok:
        raise ValueError(f"invalid {name.replace('_', '-')}={value!r}: {why}")


def _validate(cfg: RunConfig) -> None:
    for name, choices in _CHOICES.items():
        value = getattr(cfg, name)
        _check(value in choices, name, value, f"choose one of {sorted(choices)}")
    for f in fields(cfg):
        value = getattr(cfg, f.name)
        if isinstance(value, float):
            _check(math.isfinite(value), f.name, value, "must be finite")
    _check(cfg.num_server_rounds >= 1, "num_server_rounds", cfg.num_server_rounds, "must be >= 1")
    _check(0.0 < cfg.fraction_train <= 1.0, "fraction_train", cfg.fraction_train, "must be in (0, 1]")
    _check(cfg.min_replies >= 1, "min_replies", cfg.min_replies, "must be >= 1")
    _check(cfg.local_steps >= 1, "local_steps", cfg.local_steps, "must be >= 1")
    _check(cfg.batch_size >= 1, "batch_size", cfg.batch_size, "must be >= 1")
    _check(cfg.lr >= 0.0, "lr", cfg.lr, "must be > 0 (or 0 for the preset's default)")
    _check(cfg.weight_decay >= 0.0 or cfg.weight_decay == -1.0, "weight_decay", cfg.weight_decay,
           "must be >= 0 (or -1 for the preset's default)")
    _check(0.0 <= cfg.beta1 < 1.0, "beta1", cfg.beta1, "must be in [0, 1)")
    _check(0.0 <= cfg.beta2 < 1.0, "beta2", cfg.beta2, "must be in [0, 1)")
    _check(cfg.eps > 0.0, "eps", cfg.eps, "must be > 0")
    _check(0.0 <= cfg.rho <= 1.0, "rho", cfg.rho, "must be in [0, 1]")
    _check(0.0 < cfg.tau <= 1.0, "tau", cfg.tau, "must be in (0, 1]")
    _check(cfg.alpha >= 0.0, "alpha", cfg.alpha, "must be > 0 (or 0 for 1/tau)")
    _check(cfg.gamma >= 0.0, "gamma", cfg.gamma, "must be > 0 (or 0 for tau)")
    alpha, gamma = cfg.trust_alpha, cfg.trust_gamma
    _check(gamma <= alpha, "gamma", gamma, f"must not exceed alpha={alpha} (the paper needs α ≥ γ > 0)")
    _check(cfg.dirichlet_alpha > 0.0, "dirichlet_alpha", cfg.dirichlet_alpha, "must be > 0")
    _check(cfg.classes_per_client >= 1, "classes_per_client", cfg.classes_per_client, "must be >= 1")
    _check(cfg.num_threads >= 0, "num_threads", cfg.num_threads, "must be >= 0")
    _check(cfg.round_timeout >= 0.0, "round_timeout", cfg.round_timeout, "must be >= 0")
    _check(cfg.max_reply_mb > 0.0, "max_reply_mb", cfg.max_reply_mb, "must be > 0")
    _check(cfg.eta >= 0.0, "eta", cfg.eta, "must be > 0 (or 0 for the preset's default)")
    for name in ("server_momentum", "server_beta1", "server_beta2", "b2"):
        _check(0.0 <= getattr(cfg, name) < 1.0, name, getattr(cfg, name), "must be in [0, 1)")
    _check(cfg.server_tau > 0.0, "server_tau", cfg.server_tau, "must be > 0")
    _check(0.0 < cfg.adamom_eps < 1.0, "adamom_eps", cfg.adamom_eps, "must be in (0, 1)")
    _check(cfg.mu >= 0.0 or cfg.mu == -1.0, "mu", cfg.mu, "must be >= 0 (or -1 for the preset's default)")
    _check(cfg.dyn_alpha > 0.0, "dyn_alpha", cfg.dyn_alpha, "must be > 0")
    _check(cfg.moon_tau > 0.0, "moon_tau", cfg.moon_tau, "must be > 0")
    _check(0.0 <= cfg.gamma_l <= 1.0, "gamma_l", cfg.gamma_l, "must be in [0, 1]")
    _check(0.0 <= cfg.cm_alpha <= 1.0, "cm_alpha", cfg.cm_alpha, "must be in [0, 1]")
    _check(cfg.sophia_rho > 0.0, "sophia_rho", cfg.sophia_rho, "must be > 0")
    for name in ("sophia_beta1", "sophia_beta2", "muon_momentum", "soap_beta1", "soap_beta2",
                 "shampoo_beta", "fedpac_beta"):
        _check(0.0 <= getattr(cfg, name) < 1.0, name, getattr(cfg, name), "must be in [0, 1)")
    for name in ("hessian_interval", "precondition_frequency", "max_precond_dim"):
        _check(getattr(cfg, name) >= 1, name, getattr(cfg, name), "must be >= 1")
    _check(cfg.muon_adam_lr > 0.0, "muon_adam_lr", cfg.muon_adam_lr, "must be > 0")
    _check(0.0 <= cfg.mix_lambda <= 1.0, "mix_lambda", cfg.mix_lambda, "must be in [0, 1]")
    _check(0.0 < cfg.light_c <= 1.0, "light_c", cfg.light_c, "must be in (0, 1]")
    _check(cfg.device == "auto" or cfg.device == "cpu" or cfg.device.startswith("cuda"),
           "device", cfg.device, "choose auto, cpu, cuda or cuda:N")
