"""FedAdamom (seed 004): plain local SGD; server-side adaptive momentum with a per-coordinate
β1 = clip(1 - v/v̄, 0, 1-ε) (server_rules/server_opt/adamom.py)."""

from __future__ import annotations

from adaptfl.strategies.base import AdaptiveStrategy


class FedAdamom(AdaptiveStrategy):
    """`FedAdamom(fraction_train=..., <hyperparameters>)` with the paper's defaults (docs/algorithms.md)."""

    algorithm = "fedadamom"
