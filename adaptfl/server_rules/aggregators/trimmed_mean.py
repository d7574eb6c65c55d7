"""Coordinate-wise trimmed mean (Yin et al., ICML 2018).

    per coordinate: drop the ⌊β·n⌋ largest and the ⌊β·n⌋ smallest of the n values, average the rest

Unweighted, as in the paper and Flower's `FedTrimmedAvg` (β there is `beta`, 0.2 by default):
up to ⌊β·n⌋ hostile replies are cut from every coordinate whatever values they send. With
⌊β·n⌋ = 0 (few replies) it is the plain unweighted mean, and says so in the round's metrics.
With `hostile-fraction`, the cut is its count h each round; d replies the server's checks set
aside count as hostile ones cut already: with fewer replies left than 2h + 1 it cuts the most
they allow, and refuses the round below h - d.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from adaptfl.core.params import component, param
from adaptfl.server_rules.aggregators import (
    Aggregator,
    Combine,
    Items,
    Tensors,
    coordinatewise,
)


@component("aggregator", "trimmed-mean")
@dataclass(frozen=True)
class TrimmedMean(Aggregator):
    """Coordinate-wise mean after cutting a share β of the values at each end."""

    robust = True

    trim_fraction: float = param(0.2, "trimmed-mean's β: share of the replies cut at each end of "
                                 "every coordinate", within=(0.0, 0.5), open_high=True)

    def check_federation(self, min_replies: int, hostile: int = 0) -> None:
        if min_replies - 2 * hostile < 1:
            raise ValueError(f"aggregator='trimmed-mean' cannot cut {hostile} hostile at each end "
                             f"of min-replies={min_replies}")

    def combine(self, items: Items, weights: Sequence[float], record: str, ctx: Combine) -> Tensors:
        n = len(items)
        if ctx.hostile is None:
            cut = math.floor(self.trim_fraction * n)  # β < 0.5: always leaves one
        else:  # hostile-fraction's count; replies set aside before count against it (Combine)
            cut = ctx.tolerance(ctx.hostile, (n - 1) // 2,
                                f"trimmed-mean cannot cut {ctx.hostile} at each end of {n} replies")
        ctx.stats["trimmed-per-end"] = float(cut)
        ctx.stats["aggregator-set-aside"] = float(2 * cut)  # values per coordinate
        return coordinatewise(items, record, ctx,
                              lambda values: values.sort(dim=0).values[cut:n - cut].mean(dim=0))
