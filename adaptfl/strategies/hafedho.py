"""HaFedHo (seed 003): stateful clients optimize a Taylor-rectified local objective
f_i(w) + μ·(f + hᵀ(w - w_t)); the server keeps g = -mean Δ_i / lr and f̂ = mean f̂_i
(algorithms/components/hafedho.py)."""

from __future__ import annotations

from adaptfl.strategies.base import AdaptiveStrategy


class HaFedHo(AdaptiveStrategy):
    """`HaFedHo(fraction_train=..., <hyperparameters>)` with the paper's defaults (docs/algorithms.md)."""

    algorithm = "hafedho"
