"""The (sample-count or uniformly) weighted mean, accumulated in float64 in a fixed order."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from adaptfl.algorithms.params import component
from adaptfl.strategies.aggregate import weighted_mean
from adaptfl.strategies.aggregators import Aggregator, Tensors


@component("aggregator", "mean")
@dataclass(frozen=True)
class Mean(Aggregator):
    """Σ_i w_i·t_i / Σ_i w_i."""

    def combine(self, items: Sequence[Mapping[str, torch.Tensor]], weights: Sequence[float]) -> Tensors:
        return weighted_mean(items, weights)
