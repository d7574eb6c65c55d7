"""FedAvg over any local optimizer (fedavg, localadam, localadamw): x <- x + mean Δ_i.

McMahan et al. 2017. Local optimizer state never leaves the client; the base class's default
hooks are exactly this rule.
"""

from __future__ import annotations

from adaptfl.strategies.base import AdaptiveStrategy


class FedAvgStrategy(AdaptiveStrategy):
    """Sample-count weighted averaging of the model changes."""
