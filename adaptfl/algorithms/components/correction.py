"""Corrections with the server's global direction: u = (1-ρ)·d + ρ·Δ_G at every local step.

The server keeps Δ_G = -mean Δ_i / (K·lr) (lr of the round) and sends it from round 2 on; before
that Δ_G = 0, so round 1 steps with (1-ρ)·d (seed 000, Algorithm 1). The variants are the same
math with each paper's knob and name:

    global-direction   ρ = rho           FedAdamW / FedACT (seed 000)            record delta-g
    fedpac             ρ = fedpac-beta   FedPAC (seed 001): local optimizer at   record g-g
                                         lr·(1-β), then x -= β·lr·g_G
    fedlada            ρ = gamma-l       FedLADA (Sun et al. 2023)                record delta-g
    fedcm              ρ = 1 - cm-alpha  FedCM (Xu et al. 2021): u = α·g + (1-α)·Δ_G
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from adaptfl.core import wire
from adaptfl.core.contract import Record
from adaptfl.core.params import component, fields_of, param
from adaptfl.core.stage import Aggregation, ClientPart, ClientRound, RoundInfo, Stage, Tensors

if TYPE_CHECKING:
    from adaptfl.local_update import LocalUpdate

UNIT = (0.0, 1.0)


class Correction(Stage):
    """Base: no correction."""

    record: ClassVar[str] = wire.DELTA_G
    mode: ClassVar[str] = "mix"  # LocalUpdate's `correction`: mix | after-step (FedPAC)

    @property
    def weight(self) -> float:
        return 0.0

    def check(self) -> None:
        # u = Δ_G alone: Δ_G starts at 0 and is the mean of what the clients moved, so nothing
        # (but weight decay) ever moves the model: the run would "complete" untrained
        if self.weight >= 1.0:
            key = next(f.key for f in fields_of(type(self)))
            raise ValueError(f"invalid {key}={getattr(self, key.replace('-', '_'))!r}: the local "
                             "direction gets weight 0, and Δ_G starts at 0, so the model never moves")

    def records_down(self) -> tuple[Record, ...]:
        return (Record(self.record, doc="the global direction of the previous round"),) \
            if self.weight > 0.0 else ()

    def optimizer_options(self, info: RoundInfo) -> dict[str, Any]:
        return {"rho": self.weight, "correction": self.mode} if self.weight > 0.0 else {}

    def start(self, ctx: ClientRound) -> ClientPart:
        return _SetDirection(ctx.records.get(self.record))

    def aggregate(self, agg: Aggregation) -> None:
        if self.weight > 0.0:
            per_step = agg.delta_per_step()  # mean of Δ_i/K_i: each reply's own K (local-epochs)
            agg.new_extras[self.record] = {n: per_step[n] * (-1.0 / agg.info.lr) for n in agg.spec.parameters}


class _SetDirection(ClientPart):
    def __init__(self, direction: Tensors | None) -> None:
        self.direction = direction

    def configure(self, opt: LocalUpdate) -> None:
        if self.direction is not None:
            opt.set_global_direction(self.direction)


@component("correction", "none")
@dataclass(frozen=True)
class NoCorrection(Correction):
    """The local direction alone."""


@component("correction", "global-direction")
@dataclass(frozen=True)
class GlobalDirection(Correction):
    """FedAdamW / FedACT: u = (1-ρ)·d + ρ·Δ_G."""

    rho: float = param(0.5, "weight ρ of the global direction Δ_G in u = (1-ρ)·d + ρ·Δ_G", within=UNIT)

    @property
    def weight(self) -> float:
        return self.rho


@component("correction", "fedpac")
@dataclass(frozen=True)
class FedPACCorrection(Correction):
    """FedPAC (seed 001, Figure 4's local-global alignment; docs/algorithms.md): the local optimizer
    at lr·(1-β), then x -= β·lr·g_G after each step."""

    fedpac_beta: float = param(0.5, "FedPAC's β: lr_loc = (1-β)·lr, x -= β·lr·g_G after each step",
                               within=UNIT)
    record: ClassVar[str] = wire.G_G
    mode: ClassVar[str] = "after-step"

    @property
    def weight(self) -> float:
        return self.fedpac_beta


@component("correction", "fedlada")
@dataclass(frozen=True)
class FedLADACorrection(Correction):
    """FedLADA: u = (1-γ_l)·d + γ_l·Δ_G."""

    gamma_l: float = param(0.9, "FedLADA's global offset weight γ_l", within=UNIT)

    @property
    def weight(self) -> float:
        return self.gamma_l


@component("correction", "fedcm")
@dataclass(frozen=True)
class FedCMCorrection(Correction):
    """FedCM: u = α·g + (1-α)·Δ_G."""

    cm_alpha: float = param(0.1, "FedCM's α: weight of the local gradient", within=UNIT)

    @property
    def weight(self) -> float:
        return 1.0 - self.cm_alpha
