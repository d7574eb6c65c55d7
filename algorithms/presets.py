"""Named algorithms as recipes over the composable local update, plus a server rule.

A preset fixes the *structure* (which preconditioner, whether Δ_G correction, trust modulation
and second-moment sync are on) and the default lr / weight decay; the numeric hyperparameters
(ρ, τ, α, γ, β1, β2, …) come from the run config. `preconditioner=` and `trust=` in the run
config override the preset's choice, so any combination the pieces allow can be run.
"""

from __future__ import annotations

from dataclasses import dataclass

from adaptfl.algorithms.config import PRESET, RunConfig


@dataclass(frozen=True)
class Preset:
    preconditioner: str  # "sgd" | "adam" (coupled L2) | "adamw" (decoupled wd)
    correction: bool  # u = (1-ρ)d + ρΔ_G; False forces ρ = 0 and Δ_G is never sent
    trust: str  # "none" | "act" | "cautious" | "mgup"
    v_sync: bool  # warm-start v from v̄ and upload v; False forces v-sync = "none"
    bias_correction: str  # "paper" | "single-counter" | "local" | "off"
    lr: float  # default local lr (FMNIST CNN main job; the papers tune per model)
    weight_decay: float
    server: str  # strategy name in strategies/ ("fedavg" | "fedact" | "hafedho" | "scaffold" | …)
    paper: str
    server_opt: str = "none"  # rule on the mean Δ (strategies/server_opt.py)
    mu: float = 0.0  # default μ of the client terms that use one (HaFedHo, FedProx, MOON)
    terms: str = ""  # client-side terms, comma-separated (client_app/terms.py)
    rho_from: str = "rho"  # which config key gives ρ: "rho" | "gamma-l" (FedLADA) | "cm-alpha" (FedCM)
    mixing: bool = False  # FedMIX-P: the applied preconditioner mixes Θ^r and the client's own (λ)


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
    # Server optimizers over local SGD (Reddi et al. 2021; Hsu et al. 2019; seed 004).
    "fedavgm": Preset("sgd", False, "none", False, "off", 0.1, 1e-3, "fedavg",
                      "Hsu et al. 2019 (FedAvgM)", server_opt="avgm"),
    "fedadam": Preset("sgd", False, "none", False, "off", 0.1, 1e-3, "fedavg",
                      "Reddi et al. 2021 (FedAdam)", server_opt="adam"),
    "fedyogi": Preset("sgd", False, "none", False, "off", 0.1, 1e-3, "fedavg",
                      "Reddi et al. 2021 (FedYogi)", server_opt="yogi"),
    "fedadagrad": Preset("sgd", False, "none", False, "off", 0.1, 1e-3, "fedavg",
                         "Reddi et al. 2021 (FedAdagrad)", server_opt="adagrad"),
    "fedadamom": Preset("sgd", False, "none", False, "off", 0.1, 1e-3, "fedavg",
                        "seed 004 (FedAdamom)", server_opt="adamom"),
    # Client-side baselines (each term's equation and paper: client_app/term_*.py).
    "hafedho": Preset("sgd", False, "none", False, "off", 0.1, 1e-3, "hafedho",
                      "seed 003 (HaFedHo)", mu=0.01, terms="hafedho"),
    "fedprox": Preset("sgd", False, "none", False, "off", 0.1, 1e-3, "fedavg",
                      "Li et al. 2020 (FedProx)", mu=0.01, terms="prox"),
    "scaffold": Preset("sgd", False, "none", False, "off", 0.1, 1e-3, "scaffold",
                       "Karimireddy et al. 2020 (SCAFFOLD, option II)", terms="scaffold"),
    "fedcm": Preset("sgd", True, "none", False, "off", 0.1, 1e-3, "fedact",
                    "Xu et al. 2021 (FedCM)", rho_from="cm-alpha"),
    "fedlada": Preset("adam", True, "none", True, "off", 1e-3, 1e-3, "fedact",
                      "Sun et al. 2023 (FedLADA)", rho_from="gamma-l"),
    "feddyn": Preset("sgd", False, "none", False, "off", 0.1, 1e-3, "feddyn",
                     "Acar et al. 2021 (FedDyn)", terms="feddyn"),
    "moon": Preset("sgd", False, "none", False, "off", 0.1, 1e-3, "fedavg",
                   "Li, He & Song 2021 (MOON)", mu=1.0, terms="moon"),
    "mimelite": Preset("sgd", True, "none", False, "off", 0.1, 1e-3, "mimelite",
                       "Karimireddy et al. 2021 (MimeLite)", terms="grad-at-x", rho_from="beta1"),
}

# Second-order local optimizers (spec §2-4): lr / wd are the optimizers' authors' defaults
# (Sophia's lr for small models: its update is clipped to ±1 per coordinate, like sign descent).
_SECOND_ORDER_LR = {"sophia": (1e-3, 0.1), "muon": (0.02, 0.01), "soap": (3e-3, 0.01)}
for _x, (_lr, _wd) in _SECOND_ORDER_LR.items():
    PRESETS[f"local-{_x}"] = Preset(_x, False, "none", False, "local", _lr, _wd, "fedavg",
                                    f"local {_x}, FedAvg of models, state never shared")
    PRESETS[f"fedpac-{_x}"] = Preset(_x, True, "none", False, "local", _lr, _wd, "fedpac",
                                     "seed 001 (FedPAC)", rho_from="fedpac-beta")
    PRESETS[f"fedmixp-{_x}"] = Preset(_x, False, "none", False, "local", _lr, _wd, "fedmixp",
                                      "seed 002 (FedMIX-P)", mixing=True)
SECOND_ORDER_SERVERS = ("fedpac", "fedmixp")  # strategies that share Θ


# Default server learning rate η per server rule (`eta=0`): plain steps for averaging, FedAvgM and
# FedAdamom (seed 004: η_g = 1); Reddi et al.'s typical best order for the 1/sqrt(v)-scaled rules
# (Flower's own defaults are 0.1 / 0.01 / 0.1 for Adam / Yogi / Adagrad).
DEFAULT_ETA = {"none": 1.0, "avgm": 1.0, "adam": 0.01, "yogi": 0.01, "adagrad": 0.01, "adamom": 1.0}


def preset_rho(cfg: RunConfig, preset: Preset) -> float:
    """ρ of u = (1-ρ)d + ρΔ_G, from the config key the preset names (same math, paper's knob)."""
    return {"rho": cfg.rho, "gamma-l": cfg.gamma_l, "cm-alpha": 1.0 - cfg.cm_alpha,
            "beta1": cfg.beta1, "fedpac-beta": cfg.fedpac_beta}[preset.rho_from]


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
    server_opt: str = "none"
    eta: float = 1.0
    mu: float = 0.0
    terms: str = ""
    mixing: bool = False  # FedMIX-P's λ mixing (λ of the round: recipe.mix_lambda)


def resolve(cfg: RunConfig) -> Resolved:
    preset = get_preset(cfg.algorithm)
    preconditioner = preset.preconditioner if cfg.preconditioner == PRESET else cfg.preconditioner
    trust = preset.trust if cfg.trust == PRESET else cfg.trust
    bias = preset.bias_correction if cfg.bias_correction == PRESET else cfg.bias_correction
    v_sync = cfg.v_sync if preset.v_sync else "none"
    server_opt = preset.server_opt if cfg.server_opt == PRESET else cfg.server_opt
    if preconditioner == "sgd" and v_sync != "none":
        raise ValueError(f"algorithm {cfg.algorithm!r} with preconditioner='sgd' has no second "
                         "moment to sync; choose an adaptive preconditioner")
    _check_second_order(cfg, preset, preconditioner, trust, v_sync)
    if v_sync != "none" and bias == "local":
        raise ValueError("bias-correction='local' restarts the v correction every round, which "
                         "contradicts a synced v; use 'paper' or 'single-counter'")
    return Resolved(
        algorithm=cfg.algorithm,
        server=preset.server,
        preconditioner=preconditioner,
        trust=trust,
        rho=preset_rho(cfg, preset) if preset.correction else 0.0,
        v_sync=v_sync,
        bias_correction=bias,
        lr=cfg.lr if cfg.lr > 0.0 else preset.lr,
        weight_decay=cfg.weight_decay if cfg.weight_decay >= 0.0 else preset.weight_decay,
        server_opt=server_opt,
        eta=cfg.eta if cfg.eta > 0.0 else DEFAULT_ETA[server_opt],
        mu=cfg.mu if cfg.mu >= 0.0 else preset.mu,
        terms=preset.terms,
        mixing=preset.mixing,
    )


def _check_second_order(cfg: RunConfig, preset: Preset, preconditioner: str, trust: str,
                        v_sync: str) -> None:
    """Refuse combinations of the pieces that make no sense, before round 1."""
    second = preconditioner in ("sophia", "muon", "soap")
    if preset.server in SECOND_ORDER_SERVERS and not second:
        raise ValueError(f"algorithm {cfg.algorithm!r} shares preconditioner state Θ, which "
                         f"preconditioner={preconditioner!r} does not have; choose sophia, muon or soap")
    if second and v_sync != "none":
        raise ValueError(f"preconditioner={preconditioner!r} has no Adam second moment v to sync "
                         f"(algorithm {cfg.algorithm!r}); set v-sync='none'")
    if preconditioner == "muon" and trust != "none" and not cfg.trust_on_muon:
        raise ValueError(f"trust={trust!r} scales single coordinates of Muon's orthogonalised "
                         "update, which breaks its orthogonality; set trust-on-muon=true to opt in")
    if cfg.light and preset.server not in SECOND_ORDER_SERVERS:
        raise ValueError(f"light=true compresses the uploaded Θ, but {cfg.algorithm!r} shares none")
