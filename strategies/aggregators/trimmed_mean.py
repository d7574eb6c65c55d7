"""Coordinate-wise trimmed mean (Yin et al., ICML 2018).

    per coordinate: drop the ⌊β·n⌋ largest and the ⌊β·n⌋ smallest of the n values, average the rest

Unweighted, as in the paper and Flower's `FedTrimmedAvg` (β there is `beta`, 0.2 by default):
up to ⌊β·n⌋ hostile replies are cut from every coordinate whatever values they send. With
⌊β·n⌋ = 0 (few replies) it is the plain unweighted mean, and says so in the round's metrics.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from adaptfl.algorithms.params import component, param
from adaptfl.strategies.aggregators import Aggregator, Combine, Items, Tensors, back, stacked


@component("aggregator", "trimmed-mean")
@dataclass(frozen=True)
class TrimmedMean(Aggregator):
    """Coordinate-wise mean after cutting a share β of the values at each end."""

    robust = True

    trim_fraction: float = param(0.2, "trimmed-mean's β: share of the replies cut at each end of "
                                 "every coordinate", within=(0.0, 0.5), open_high=True)

    def combine(self, items: Items, weights: Sequence[float], record: str, ctx: Combine) -> Tensors:
        n = len(items)
        cut = math.floor(self.trim_fraction * n)
        ctx.stats["trimmed-per-end"] = float(cut)
        ctx.stats["aggregator-set-aside"] = float(2 * cut)  # values per coordinate
        out = {}
        for name, like in items[0].items():
            ordered = stacked(items, name).sort(dim=0).values
            out[name] = back(ordered[cut:n - cut].mean(dim=0), like)
        return ctx.project(record, out)
