"""Coordinate-wise median (Yin et al., ICML 2018, "Byzantine-robust distributed learning").

    t[j] = median_i t_i[j]          per coordinate j, over the n replies (unweighted)

Unweighted, as in the paper and Flower's `FedMedian`: the weights are the clients' own claims
(num-examples), which a hostile client sets at will. With fewer than half of the replies
hostile, every coordinate stays within the range of the honest values. For even n the two
middle values are averaged (numpy's and Flower's convention).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from adaptfl.core.params import component
from adaptfl.server_rules.aggregators import (
    AggregationRefused,
    Aggregator,
    Combine,
    Items,
    Tensors,
    coordinatewise,
)


def coordinate_median(values: torch.Tensor) -> torch.Tensor:
    """Median over dim 0 of [n, ...]; the mean of the two middle values for even n."""
    ordered = values.sort(dim=0).values
    n = ordered.shape[0]
    return ordered[n // 2] if n % 2 else 0.5 * (ordered[n // 2 - 1] + ordered[n // 2])


@component("aggregator", "median")
@dataclass(frozen=True)
class Median(Aggregator):
    """Coordinate-wise median of every combined record."""

    robust = True

    def check_federation(self, min_replies: int, hostile: int = 0) -> None:
        if 2 * hostile >= min_replies:
            raise ValueError(f"aggregator='median' cannot tolerate {hostile} hostile of "
                             f"min-replies={min_replies}: needs fewer than half")

    def combine(self, items: Items, weights: Sequence[float], record: str, ctx: Combine) -> Tensors:
        if ctx.hostile is not None and 2 * ctx.hostile >= len(items):
            raise AggregationRefused(f"median of {len(items)} replies cannot tolerate {ctx.hostile} hostile")
        n = len(items)
        ctx.stats["aggregator-set-aside"] = float(n - 1 if n % 2 else n - 2)  # values per coordinate
        return coordinatewise(items, record, ctx, coordinate_median)
