"""Pure helpers for aggregation: weighted means, payload sizes, direction consistency."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

Tensors = Mapping[str, torch.Tensor]


def weighted_mean(items: Sequence[Tensors], weights: Sequence[float]) -> dict[str, torch.Tensor]:
    """Σ_i w_i·t_i / Σ_i w_i per key, accumulated in float64 in the given order."""
    if not items or len(items) != len(weights):
        raise ValueError(f"need one weight per item, got {len(items)} items, {len(weights)} weights")
    total = float(sum(weights))
    if total <= 0.0:
        raise ValueError(f"weights must sum to > 0, got {total}")
    out = {}
    for key, first in items[0].items():
        acc = torch.zeros(first.shape, dtype=torch.float64)
        for item, w in zip(items, weights, strict=True):
            acc.add_(item[key].to(torch.float64), alpha=w / total)
        out[key] = acc.round().to(first.dtype) if not first.is_floating_point() else \
            acc.to(first.dtype)
    return out


def num_bytes(tensors: Tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def flat_float(tensors: Tensors) -> torch.Tensor:
    return torch.cat([t.reshape(-1).to(torch.float64) for t in tensors.values()
                      if t.is_floating_point()])


def direction_consistency(deltas: Sequence[Tensors], mean: Tensors) -> float:
    """DC = mean_i cos(Δ_i, mean_j Δ_j) (seed 000, appendix A)."""
    reference = flat_float(mean)
    norm = float(reference.norm())
    if norm == 0.0:
        return 0.0
    cosines = []
    for delta in deltas:
        d = flat_float(delta)
        dn = float(d.norm())
        cosines.append(float(d @ reference) / (dn * norm) if dn > 0 else 0.0)
    return sum(cosines) / len(cosines)


def cap_shares(weights: Sequence[float], max_share: float) -> list[float]:
    """Weights whose shares w_i / Σw are at most `max_share` (`max-weight-share`,
    docs/robustness.md: one reply claiming num-examples = 2**62 was the whole mean).
    Water-filling: the capped replies sit at the cap, the others keep their proportions of the
    rest. If nobody exceeds the cap the weights are
    returned unchanged (bit-identical means); if n·cap < 1 no shares can satisfy it and the
    closest, equal shares, are used."""
    n = len(weights)
    total = float(sum(weights))
    if max_share >= 1.0 or n == 0 or total <= 0.0 or max(weights) / total <= max_share:
        return list(weights)
    if max_share * n <= 1.0:
        return [1.0] * n
    capped: set[int] = set()
    while True:
        free = sum(w for i, w in enumerate(weights) if i not in capped)
        left = 1.0 - max_share * len(capped)
        over = {i for i, w in enumerate(weights) if i not in capped and w / free * left > max_share}
        if not over:
            return [max_share if i in capped else w / free * left for i, w in enumerate(weights)]
        capped |= over
