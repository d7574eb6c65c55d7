"""The robust estimate of federated evaluation's scores (docs/metrics.md, "Federated evaluation"):
what one client, or the declared hostile share of them, can move a reported figure by.

Per score, the n replies that report it are sorted by value and the h lowest and h highest are
cut, as the coordinate-wise trimmed mean cuts training's replies (Yin et al., ICML 2018):

    h    = ceil(hostile-fraction · n) (sampling.py `hostile_count`), at least ONE_LIAR, at most ⌊(n−1)/2⌋
    mean = Σ_{kept} (w_i / Σ_{kept} w) · v_i     w_i: num-examples capped at max-weight-ratio × median
    p10  = the 10th percentile of the kept values

While at most h replies lie, every kept value lies between two honest ones, so the mean and the
worst decile stay inside the honest clients' range whatever the liars send; the weights are
normalised before the products so that no finite value (a loss of 1e308) overflows to infinity.
A round of one or two replies cuts nothing (there is no middle to keep) and says so (h = 0).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from adaptfl.algorithms.sampling import hostile_count

# with hostile-fraction=0 (the default) one lying client is still held, as training's
# contribution bound holds one reply a round by default (docs/robustness.md)
ONE_LIAR = 1


def cut_per_end(hostile_fraction: float, replies: int) -> int:
    """h for a score reported by `replies` clients (module docstring)."""
    wanted = max(ONE_LIAR, hostile_count(hostile_fraction, replies))
    return min(wanted, (replies - 1) // 2) if replies > 0 else 0


def worst_decile(values: Sequence[float]) -> float:
    """The 10th percentile of `values`, linear between the closest ranks (numpy's default):
    sorted v, position p = 0.1·(n−1), v[⌊p⌋] + (p − ⌊p⌋)·(v[⌊p⌋+1] − v[⌊p⌋])."""
    ordered = sorted(values)
    position = 0.1 * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (position - low) * (ordered[high] - ordered[low])


def trimmed(values: Sequence[float], weights: Sequence[float], cut: int) -> tuple[list[float], list[float]]:
    """(values, weights) of the replies kept after cutting `cut` at each end by value; ties keep
    the given order (callers pass replies in partition order: any arrival order, one result)."""
    order = sorted(range(len(values)), key=lambda i: (values[i], i))
    kept = order[cut:len(order) - cut]
    return [values[i] for i in kept], [weights[i] for i in kept]


def weighted_mean(values: Sequence[float], weights: Sequence[float]) -> float:
    """Σ (w_i / Σ w) · v_i: each term at most max |v| in size, so finite values give a finite mean."""
    total = math.fsum(weights)
    return math.fsum(v * (w / total) for v, w in zip(values, weights, strict=True))
