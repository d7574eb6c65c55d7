"""Sharing the preconditioner state Θ: FedPAC's alignment (seed 001) and FedMIX-P's stepwise
mixing (seed 002).

    align   client: Θ^r becomes its own state (warm start; SOAP recomputes Q from it and steps
            fully at once); uploads its terminal Θ_i.
    mix     the same warm start, and at every step the applied preconditioner is
            (1-λ_r)·P^r + λ_r·P_i with P^r frozen for the round (λ_r below).
    server  Θ <- mean Θ_i element-wise, by "<param>/<slot>" name; per round the drift
            mean_i Σ ||Θ_i - Θ̄||² (FedPAC's Figure 3) and, with `light`, the upload's size
            relative to the full Θ.

`light` (fedpac-light) uploads a low-rank / block-mean Θ_i (local_update/theta.py) that the
server expands before averaging.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from adaptfl.core import wire
from adaptfl.core.contract import ArraySpec, ModelSpec, Record
from adaptfl.core.domain import Domain
from adaptfl.core.params import component, param
from adaptfl.core.stage import Aggregation, ClientPart, ClientRound, PartOutput, RoundInfo, Stage
from adaptfl.local_update.theta import compress, drift, expand, light_domain, light_spec, theta_spec

if TYPE_CHECKING:
    from adaptfl.algorithms.algorithm import Algorithm
    from adaptfl.local_update import LocalUpdate


def spec_bytes(spec: ArraySpec) -> int:
    return sum(torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
               for shape, dtype in spec.values())


def full_theta(spec: ModelSpec, algorithm: Algorithm) -> ArraySpec:
    return theta_spec(algorithm.preconditioner, spec.param_shapes(), spec.dtype)


def uploaded_theta(spec: ModelSpec, algorithm: Algorithm) -> ArraySpec:
    sharing = algorithm.sharing
    full = full_theta(spec, algorithm)
    return light_spec(full, sharing.light_c) if isinstance(sharing, _Shared) and sharing.light else full


def theta_domain(algorithm: Algorithm, key: str) -> Domain:
    """Θ's "<param>/<slot>" entries: the preconditioner says (Sophia h ≥ 0, SOAP PSD)."""
    return algorithm.preconditioner.theta_domain(key.rsplit("/", 1)[1])


def uploaded_domain(algorithm: Algorithm, key: str) -> Domain:
    if getattr(algorithm.sharing, "light", False):
        return light_domain(algorithm.preconditioner, key)
    return theta_domain(algorithm, key)


class Sharing(Stage):
    """Base: Θ stays on the client."""

    shares: ClassVar[bool] = False

    def records_down(self) -> tuple[Record, ...]:
        return (Record(wire.THETA, full_theta, "the averaged Θ^r / reference P^r", theta_domain),) \
            if self.shares else ()

    def records_up(self) -> tuple[Record, ...]:
        return (Record(wire.THETA_LOCAL, uploaded_theta, "the client's terminal Θ_i", uploaded_domain),) \
            if self.shares else ()

    def round_lambda(self, info: RoundInfo) -> float:
        return 1.0


@dataclass(frozen=True)
class _Shared(Sharing):
    light: bool = param(False, "upload a low-rank / block-mean Θ_i (fedpac-light)")
    light_c: float = param(0.1, "light rank fraction c (Muon r = ⌊c·m·n/(m+n+1)⌋, SOAP r = ⌈c·d⌉)",
                           within=(0.0, 1.0), open_low=True)
    shares = True

    def start(self, ctx: ClientRound) -> ClientPart:
        return _ShareTheta(ctx.records.get(wire.THETA), self.round_lambda(ctx.info) < 1.0,
                           self.light_c if self.light else None)

    def aggregate(self, agg: Aggregation) -> None:
        algorithm = agg.algorithm
        full = full_theta(agg.spec, algorithm)
        thetas = agg.reply_arrays(wire.THETA_LOCAL)
        if self.light:
            thetas = [expand(t, full) for t in thetas]
        mean = agg.mean(thetas, wire.THETA)  # full-shaped Θ_i: the domains of the Θ record
        agg.new_extras[wire.THETA] = mean
        agg.stats["preconditioner-drift"] = drift(thetas, mean)
        agg.stats["theta-compression"] = spec_bytes(uploaded_theta(agg.spec, algorithm)) / \
            max(1, spec_bytes(full))


class _ShareTheta(ClientPart):
    def __init__(self, theta: Mapping[str, torch.Tensor] | None, mixing: bool,
                 light_c: float | None) -> None:
        self.theta, self.mixing, self.light_c = theta, mixing, light_c

    def configure(self, opt: LocalUpdate) -> None:
        if self.theta is not None:
            opt.import_theta(self.theta, keep_reference=self.mixing)

    def finish(self, opt: LocalUpdate, delta: Mapping[str, torch.Tensor], train_loss: float) -> PartOutput:
        theta = {k: v.detach().cpu() for k, v in opt.export_theta().items()}
        if self.light_c is not None:
            theta = compress(theta, self.light_c)
        return PartOutput(records={wire.THETA_LOCAL: theta})


@component("sharing", "none")
@dataclass(frozen=True)
class NoSharing(Sharing):
    """Θ stays on the client (local Sophia / Muon / SOAP)."""


@component("sharing", "align")
@dataclass(frozen=True)
class Align(_Shared):
    """FedPAC's alignment: the averaged Θ warm-starts every client."""


@component("sharing", "mix")
@dataclass(frozen=True)
class Mix(_Shared):
    """FedMIX-P: (1-λ_r)·P^r + λ_r·P_i applied at every step."""

    mix_lambda: float = param(0.5, "FedMIX-P's λ (λ0 or c of the schedules)", within=(0.0, 1.0))
    lambda_schedule: str = param("constant", "λ_r over rounds: constant, lambda0-sqrt-r (λ0/√r) or "
                                 "c-sqrt-R (c/√R)", choices=("constant", "lambda0-sqrt-r", "c-sqrt-R"))

    def round_lambda(self, info: RoundInfo) -> float:
        """λ_r of FedMIX-P's H = (1-λ_r)·P^r + λ_r·P_i (seed 002, "Stepwise geometry mixing"), at most
        1."""
        scale = {"constant": 1.0, "lambda0-sqrt-r": float(info.server_round**-0.5),
                 "c-sqrt-R": float(info.num_rounds**-0.5)}[self.lambda_schedule]
        return min(1.0, self.mix_lambda * scale)

    def optimizer_options(self, info: RoundInfo) -> dict[str, Any]:
        return {"mix_lambda": self.round_lambda(info)}
