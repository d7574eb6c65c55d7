"""The (sample-count or uniformly) weighted mean, accumulated in float64 in a fixed order."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from adaptfl.core.params import component
from adaptfl.server_rules.aggregate import weighted_mean
from adaptfl.server_rules.aggregators import Aggregator, Combine, Items, Tensors


@component("aggregator", "mean")
@dataclass(frozen=True)
class Mean(Aggregator):
    """Σ_i w_i·t_i / Σ_i w_i."""

    def combine(self, items: Items, weights: Sequence[float], record: str, ctx: Combine) -> Tensors:
        return weighted_mean(items, weights)
