"""Norm clipping of every reply's record, with the clipping norm adapted per record (the
adaptive clipping of Andrew et al., NeurIPS 2021, that Flower's DP wrappers implement).

    t_i <- t_i · min(1, C / ||t_i||)                    ||·|| over the record's floating arrays
    w_i <- min(w_i, median_j w_j)                       the weight is bounded as the norm is
    combined = weighted mean of the clipped t_i
    b = share of the replies with ||t_i|| ≤ C           (not clipped this round)
    C <- C · exp(-η·(b - γ))                            geometric update towards the γ-quantile

One C per record (Δ, v, Θ, Δc, …: their scales differ by orders of magnitude), kept in the
server state. Δ's C starts at `clip-norm`; 0, and every other record, start at the median of
the first round's norms, which a minority of hostile replies cannot move outside the honest
range. η = `clip-lr` (0: C stays at its first value), γ = `clip-quantile`.

Flower 1.42's `DifferentialPrivacyServerSideAdaptiveClipping` feeds the share of CLIPPED
updates into the same formula (`norm_bit = scaling_factor < 1`); that moves C the wrong way
(updates larger than C make C smaller still, towards 0), so the paper's b is used here: the
share of updates within C. No noise is added: this is robustness, not differential privacy.
Scaling by a factor in (0, 1] keeps v ≥ 0 and PSD statistics PSD.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from adaptfl.core import wire
from adaptfl.core.params import component, param
from adaptfl.server_rules.aggregate import weighted_mean
from adaptfl.server_rules.aggregators import Aggregator, Combine, Items, Tensors, flat
from adaptfl.server_rules.aggregators.median import coordinate_median

NORMS = "clip-norm"  # memory slot: {record: tensor([C])}


def clipped(item: Tensors, norm: float, bound: float) -> Tensors:
    """The floating arrays scaled by min(1, bound / norm); integer buffers unchanged."""
    if norm <= bound:
        return dict(item)
    scale = bound / norm
    return {n: (t.to(torch.float64) * scale).to(t.dtype) if t.is_floating_point() else t
            for n, t in item.items()}


@component("aggregator", "clip")
@dataclass(frozen=True)
class Clip(Aggregator):
    """Clipped weighted mean with an adaptive clipping norm per record."""

    clip_norm: float = param(0.0, "Δ's clipping norm C at the start (0: the median norm of the "
                             "first round's replies; other records always start so)",
                             within=(0.0, None))
    clip_quantile: float = param(0.5, "γ: the quantile of the reply norms that C tracks",
                                 within=(0.0, 1.0))
    clip_lr: float = param(0.2, "η of C <- C·exp(-η(b - γ)), b the share not clipped; 0: C fixed",
                           within=(0.0, None), sane=(0.0, 10.0))

    def combine(self, items: Items, weights: Sequence[float], record: str, ctx: Combine) -> Tensors:
        norms = [float(flat(item).norm()) for item in items]
        bound = self._bound(record, norms, ctx)
        # a claimed num-examples of 2**62 would take the whole mean at norm C: no reply
        # weighs more than the median claim, as no reply's norm exceeds C ≈ the median norm
        median_weight = statistics.median(weights)
        bounded = [min(w, median_weight) for w in weights]
        out = weighted_mean([clipped(dict(item), n, bound) for item, n in zip(items, norms, strict=True)],
                            bounded)
        within = sum(n <= bound for n in norms) / len(norms)
        new_bound = bound * math.exp(-self.clip_lr * (within - self.clip_quantile))
        ctx.new_memory.setdefault(NORMS, {})[record] = torch.tensor([new_bound], dtype=torch.float64)
        if record == wire.DELTA:
            ctx.stats["clip-norm"] = bound
            ctx.stats["clipped-share"] = 1.0 - within
            ctx.stats["aggregator-set-aside"] = float(sum(n > bound for n in norms))  # clipped
        return out

    def _bound(self, record: str, norms: list[float], ctx: Combine) -> float:
        kept = ctx.memory.get(NORMS, {}).get(record)
        if kept is not None:
            return float(kept)
        if record == wire.DELTA and self.clip_norm > 0.0:
            return self.clip_norm
        median = float(coordinate_median(torch.tensor(norms, dtype=torch.float64)))
        return median if median > 0.0 else 1.0  # all zero: nothing to clip yet
