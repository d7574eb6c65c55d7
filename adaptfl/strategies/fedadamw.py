"""FedAdamW (Liu et al. 2026): FedACT without trust modulation (φ ≡ 1): local AdamW corrected by
Δ_G, second moments synced through the server."""

from __future__ import annotations

from adaptfl.strategies.base import AdaptiveStrategy


class FedAdamW(AdaptiveStrategy):
    """`FedAdamW(fraction_train=..., <hyperparameters>)` with the paper's defaults (docs/algorithms.md)."""

    algorithm = "fedadamw"
