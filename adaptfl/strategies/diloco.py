"""Douillard et al. 2023 (DiLoCo): each worker keeps its inner AdamW (β = (0.9, 0.95), weight decay
0.1) across the rounds it takes part in; the server steps x with torch's SGD(momentum=0.9,
nesterov=True, lr=0.7) on the pseudo-gradient p = -mean Δ.

    client  x_i <- x;  H steps of AdamW from its own kept state (algorithms/components/local_state.py)
    server  m = 0.9·m - mean Δ_i;  x <- x - 0.7·(0.9·m - mean Δ_i)   (server_rules/server_opt/nesterov.py)"""

from __future__ import annotations

from adaptfl.strategies.base import AdaptiveStrategy


class DiLoCo(AdaptiveStrategy):
    """`DiLoCo(fraction_train=..., <hyperparameters>)` with the paper's defaults (README key table)."""

    algorithm = "diloco"
