"""FedPAC (seed 001): local Sophia / Muon / SOAP with preconditioner alignment (the averaged Θ
warm-starts every client) and correction (x -= β·lr·g_G after each local step).

    server  x <- x + mean Δ_i;  g_G <- -mean Δ_i / (K·lr);  Θ <- mean Θ_i (by name)

The parts: algorithms/components/correction.py (`fedpac`), components/sharing.py (`align`).
"""

from __future__ import annotations

from typing import Any

from adaptfl.algorithms.config import RunConfig
from adaptfl.strategies.base import AdaptiveStrategy

OPTIMIZERS = ("sophia", "muon", "soap")


class FedPAC(AdaptiveStrategy):
    """`FedPAC(optimizer="soap", fedpac_beta=0.5, ...)`."""

    algorithm = "fedpac-soap"
    family = "fedpac"

    def __init__(self, config: RunConfig | None = None, *, optimizer: str = "soap", **kw: Any) -> None:
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"invalid optimizer={optimizer!r}: choose one of {OPTIMIZERS}")
        self.algorithm = f"{self.family}-{optimizer}"
        super().__init__(config, **kw)
