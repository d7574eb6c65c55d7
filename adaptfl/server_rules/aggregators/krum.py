"""Krum and multi-Krum (Blanchard et al., NeurIPS 2017, "Machine learning with adversaries").

    score_i = Σ of the squared distances from reply i to its n - f - 2 nearest other replies
    select the m replies with the lowest scores; combine them by the weighted mean

f (`krum-byzantine`) is the number of hostile replies tolerated; Krum needs n ≥ 2f + 3. m
(`krum-select`) = 1 is Krum, m > 1 multi-Krum, 0 takes n - f (Flower's `MultiKrum` default).
A reply the server's checks set aside (screened, undecodable) counts as one of the f: with
d set aside, Krum runs on the n - d replies left with the largest f' ≤ f they support, and
refuses the round when f' < f - d. Each record is scored on its own (flattened over its
floating arrays), so a client that sends an honest Δ and a poisoned v loses its v. Ties go to
the earlier reply (replies are in a fixed order). The selected replies keep their (capped)
weights, as in Flower's `MultiKrum`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from adaptfl.core import wire
from adaptfl.core.params import component, param
from adaptfl.server_rules.aggregate import weighted_mean
from adaptfl.server_rules.aggregators import (
    Aggregator,
    Combine,
    Items,
    Tensors,
    flat,
)


def krum_scores(vectors: torch.Tensor, byzantine: int) -> torch.Tensor:
    """score_i over [n, D]: the sum of the n - f - 2 smallest squared distances to the others."""
    n = vectors.shape[0]
    dist = torch.cdist(vectors, vectors).square()
    dist.fill_diagonal_(float("inf"))  # a reply is not its own neighbour
    nearest = n - byzantine - 2
    return dist.sort(dim=1).values[:, :nearest].sum(dim=1)


@component("aggregator", "krum")
@dataclass(frozen=True)
class Krum(Aggregator):
    """Krum (m = 1) or multi-Krum (m > 1) per combined record."""

    robust = True

    krum_byzantine: int = param(1, "Krum's f: hostile replies tolerated (needs n >= 2f + 3)",
                                within=(0, None))
    krum_select: int = param(1, "replies Krum keeps: 1 (Krum), m > 1 (multi-Krum), 0 (n - f)",
                             within=(0, None))

    def needed(self, byzantine: int | None = None) -> int:
        f = self.krum_byzantine if byzantine is None else byzantine
        return max(2 * f + 3, self.krum_select)

    def check_federation(self, min_replies: int, hostile: int = 0) -> None:
        if hostile and min_replies < self.needed(hostile):
            raise ValueError(f"aggregator='krum' with {hostile} hostile of min-replies={min_replies} "
                             f"needs at least {self.needed(hostile)} replies per round")
        if not hostile and min_replies < self.needed():
            raise ValueError(f"aggregator='krum' with krum-byzantine={self.krum_byzantine} and "
                             f"krum-select={self.krum_select} needs at least {self.needed()} "
                             "replies per round")

    def combine(self, items: Items, weights: Sequence[float], record: str, ctx: Combine) -> Tensors:
        n, wanted = len(items), self.krum_byzantine if ctx.hostile is None else ctx.hostile
        most = (n - 3) // 2 if n >= self.needed(0) else -1  # the largest f these n replies support
        f = ctx.tolerance(wanted, most, f"Krum with f={wanted} needs {self.needed(wanted)} replies, got {n}")
        scores = krum_scores(torch.stack([flat(item) for item in items]), f)
        keep = self.krum_select or n - f
        # a stable order: equal scores keep the replies' fixed order
        chosen = sorted(torch.argsort(scores, stable=True)[:keep].tolist())
        if record == wire.DELTA:
            ctx.stats["krum-selected"] = float(len(chosen))
            ctx.stats["aggregator-set-aside"] = float(n - len(chosen))
            ctx.stats["krum-byzantine-used"] = float(f)
        return weighted_mean([items[i] for i in chosen], [weights[i] for i in chosen])
