"""The per-round recipe a client runs: built by the server, carried in a ConfigRecord.

The ClientApp holds no per-algorithm branches: it reads this recipe and composes the local
update from it, so switching algorithm never needs a client redeploy.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from algorithms.config import RunConfig
from algorithms.presets import resolve


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


def recipe_for_round(cfg: RunConfig, server_round: int, run_key: str = "") -> ClientRecipe:
    r = resolve(cfg)
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
    )
