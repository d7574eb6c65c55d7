"""FedACT (seed 000): client AdamW corrected by the server's global direction, second moments
synced through the server, coordinate trust modulation.

    client  u = (1-ρ)·d + ρ·Δ_G;  φ = α on the top ⌊τD⌋ of u ⊙ g, γ elsewhere;  x -= lr·φ⊙u
    server  x <- x + mean Δ_i;  Δ_G <- -mean Δ_i / (K·lr);  v̄ <- mean v_i

The parts: algorithms/components/correction.py (Δ_G), components/moments.py (v̄),
local_update/modulation.py (ACT)."""

from __future__ import annotations

from adaptfl.strategies.base import AdaptiveStrategy


class FedACT(AdaptiveStrategy):
    """`FedACT(fraction_train=..., <hyperparameters>)` with the paper's defaults (docs/algorithms.md)."""

    algorithm = "fedact"
