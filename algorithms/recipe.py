"""The per-round recipe a client runs: built by the server, carried in a ConfigRecord.

The ClientApp holds no per-algorithm branches: it reads this recipe and composes the local
update from it, so switching algorithm never needs a client redeploy.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from adaptfl.algorithms.config import RunConfig
from adaptfl.algorithms.presets import resolve


@dataclass(frozen=True)
class ClientRecipe:
    server_round: int
    preconditioner: str
    lr: float  # this round's local lr (after the schedule)
    weight_decay: float
    beta1: float
    beta2: float
    eps: float
    bias_correction: str
    rho: float
    trust: str
    tau: float
    alpha: float
    gamma: float
    trust_scope: str
    v_sync: str  # warm start v from v̄ (when sent) and upload v: "full" | "block" | "none"
    local_steps: int
    batch_size: int
    step_offset: int  # global step count t before this round's first step: (r-1)·K
    seed: int
    task: str
    model: str
    partitioning: str
    dirichlet_alpha: float
    data_dir: str
    device: str
    num_threads: int
    terms: str  # client-side terms, comma-separated (client_app/terms.py); "" = none
    mu: float  # HaFedHo / FedProx / MOON weight μ
    rectify: str  # HaFedHo: "objective" | "gradient"
    dyn_alpha: float  # FedDyn's α
    moon_tau: float  # MOON's temperature τ
    client_state_dir: str  # where durable client state is written ("" = system temp dir)
    run_key: str  # names this job's durable client state; the same across a resume
    classes_per_client: int = 2  # "pathological" partitioning: labels per client
    # --- second-order optimizers, FedPAC, FedMIX-P (local_update/second_order.py) ---
    sophia_rho: float = 0.04
    sophia_beta1: float = 0.965
    sophia_beta2: float = 0.99
    hessian_interval: int = 10
    muon_momentum: float = 0.95
    muon_adam_lr: float = 3e-4  # this round's AdamW lr of Muon's other parameters (scheduled)
    muon_routing: str = "hidden"
    trust_on_muon: bool = False
    soap_beta1: float = 0.95
    soap_beta2: float = 0.95
    shampoo_beta: float = 0.95
    precondition_frequency: int = 10
    max_precond_dim: int = 10000
    mix_lambda: float = 1.0  # λ_r of this round (1: the client's own state only, no mixing)
    upload_theta: bool = False  # reply with the terminal Θ_i (FedPAC, FedMIX-P)
    light: bool = False
    light_c: float = 0.1

    def to_config(self) -> dict[str, Any]:
        return {k.replace("_", "-"): v for k, v in asdict(self).items()}

    @classmethod
    def from_config(cls, record: Any) -> ClientRecipe:
        known = {f.name.replace("_", "-"): f.name for f in fields(cls)}
        missing = sorted(set(known) - set(record.keys()))
        if missing:
            raise ValueError(f"recipe from the server lacks keys {missing}; server and client "
                             "versions of adaptfl differ")
        return cls(**{name: record[key] for key, name in known.items()})


def round_lr(lr: float, schedule: str, server_round: int, num_rounds: int) -> float:
    """Cosine decay over rounds (to 0 after the last round), or constant."""
    if schedule == "constant":
        return lr
    return lr * 0.5 * (1.0 + math.cos(math.pi * (server_round - 1) / num_rounds))


def round_lambda(lam: float, schedule: str, server_round: int, num_rounds: int) -> float:
    """FedMIX-P's λ_r (spec §4): constant, λ0/sqrt(r), or the horizon's c/sqrt(R); at most 1."""
    scale = {"constant": 1.0, "lambda0-sqrt-r": server_round**-0.5, "c-sqrt-R": num_rounds**-0.5}
    return min(1.0, lam * scale[schedule])


def recipe_for_round(cfg: RunConfig, server_round: int, run_key: str = "") -> ClientRecipe:
    r = resolve(cfg)
    schedule = round_lr(1.0, cfg.lr_schedule, server_round, cfg.num_server_rounds)
    return ClientRecipe(
        server_round=server_round,
        preconditioner=r.preconditioner,
        lr=round_lr(r.lr, cfg.lr_schedule, server_round, cfg.num_server_rounds),
        weight_decay=r.weight_decay,
        beta1=cfg.beta1,
        beta2=cfg.beta2,
        eps=cfg.eps,
        bias_correction=r.bias_correction,
        rho=r.rho,
        trust=r.trust,
        tau=cfg.tau,
        alpha=cfg.trust_alpha,
        gamma=cfg.trust_gamma,
        trust_scope=cfg.trust_scope,
        v_sync=r.v_sync,
        local_steps=cfg.local_steps,
        batch_size=cfg.batch_size,
        step_offset=(server_round - 1) * cfg.local_steps,
        seed=cfg.seed,
        task=cfg.task,
        model=cfg.model,
        partitioning=cfg.partitioning,
        dirichlet_alpha=cfg.dirichlet_alpha,
        data_dir=cfg.data_dir,
        device=cfg.device,
        num_threads=cfg.num_threads,
        terms=r.terms,
        mu=r.mu,
        rectify=cfg.rectify,
        dyn_alpha=cfg.dyn_alpha,
        moon_tau=cfg.moon_tau,
        client_state_dir=cfg.client_state_dir,
        run_key=run_key,
        classes_per_client=cfg.classes_per_client,
        sophia_rho=cfg.sophia_rho,
        sophia_beta1=cfg.sophia_beta1,
        sophia_beta2=cfg.sophia_beta2,
        hessian_interval=cfg.hessian_interval,
        muon_momentum=cfg.muon_momentum,
        muon_adam_lr=cfg.muon_adam_lr * schedule,
        muon_routing=cfg.muon_routing,
        trust_on_muon=cfg.trust_on_muon,
        soap_beta1=cfg.soap_beta1,
        soap_beta2=cfg.soap_beta2,
        shampoo_beta=cfg.shampoo_beta,
        precondition_frequency=cfg.precondition_frequency,
        max_precond_dim=cfg.max_precond_dim,
        mix_lambda=round_lambda(cfg.mix_lambda, cfg.lambda_schedule, server_round,
                                cfg.num_server_rounds) if r.mixing else 1.0,
        upload_theta=r.server in ("fedpac", "fedmixp"),
        light=cfg.light,
        light_c=cfg.light_c,
    )
