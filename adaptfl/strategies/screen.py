"""Safe defaults against one hostile reply under any aggregator (issue 21 §2): no claimed sample
count outweighs the round's median by more than a bounded factor, and each reply's records are
compared with the round's other replies.

    weights  w_i <- min(w_i, max-weight-ratio · median_j w_j)
    screen   a reply is dropped when f_i·||Δ_i|| > screen-ratio · median_{j≠i} f_j·||Δ_j||
             (Δ only: honest shared state (Θ, Muon's momentum, SOAP's statistics) differs by
             thousands between non-IID clients and is held by its domain checks instead;
             a reply dropped for its Δ takes its state records with it; the median of the
             OTHER replies, so with two replies each is judged against the other, and one
             reply is never screened;
             f_i = 1, or for a reply whose claim was capped the cap over the median: its pull
             on the mean is its weight times its size, so Δ = -x of a modest norm claiming
             2**62 examples is screened as surely as a Δ × -20 of an honest weight)

Both are sized so that honest runs never trigger them (docs/robustness.md: the largest ratios
of the results page's grids, and the partition sizes of Dirichlet α = 0.1), so an honest round
is bit-identical with or without them: with no claim capped every f_i is 1 and the screen
compares plain norms (partition sizes of honest clients differ too much, in small samples of a
skewed split, to screen honest replies by weight). The round's metrics record the largest ratio
seen (`screen-ratio-max`), the replies screened and the weights capped. With two replies the
median of the claims is their mean, which no claim exceeds twice: a liar's weight cannot be told
from an honest one's there.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Collection, Sequence

from adaptfl.strategies.aggregators import flat
from adaptfl.strategies.validation import DecodedReply


def pull_ratios(replies: Sequence[DecodedReply], factors: Sequence[float],
                squared: Collection[str] = (), only: Collection[str] | None = None
                ) -> list[tuple[float, str]]:
    """Per reply: its largest ratio f_i·||t_i|| / median_{j≠i} f_j·||t_j|| over the records, and
    which record (0 with fewer than two replies, or where the others' median is 0). Records in
    `squared` (second moments, SOAP's G·Gᵀ: v ≥ 0 or PSD) are compared by sqrt(||t_i||), the
    scale of the gradients they square: a client with 3× the others' gradients is 9× in them."""
    if len(replies) < 2:
        return [(0.0, "")] * len(replies)
    records = sorted(r for r in replies[0].arrays if only is None or r in only)
    pulls = {r: [f * _size(reply.arrays[r], r in squared) for reply, f in zip(replies, factors, strict=True)]
             for r in records}
    out = []
    for i in range(len(replies)):
        worst = (0.0, "")
        for record, values in pulls.items():
            others = statistics.median(values[:i] + values[i + 1:])
            ratio = values[i] / others if others > 0.0 else 0.0
            worst = max(worst, (ratio if math.isfinite(ratio) else math.inf, record))
        out.append(worst)
    return out


def _size(tensors: dict, squared: bool) -> float:
    norm = float(flat(tensors).norm())
    return math.sqrt(norm) if squared else norm


def screened(replies: Sequence[DecodedReply], factors: Sequence[float], limit: float,
             squared: Collection[str] = (), only: Collection[str] | None = None
             ) -> tuple[list[int], dict[int, str], float]:
    """(indices kept, index -> why screened, the largest ratio among the kept); limit 0: off;
    `only`: the records compared (None: all)."""
    ratios = pull_ratios(replies, factors, squared, only)
    dropped = {i: f"screened: {record} {'norm' if factors[i] == 1.0 else 'capped weight × norm'} "
                  f"{ratio:.3g}× the median of the round's other replies (screen-ratio={limit:g})"
               for i, (ratio, record) in enumerate(ratios) if limit > 0.0 and ratio > limit}
    kept = [i for i in range(len(replies)) if i not in dropped]
    return kept, dropped, max((ratios[i][0] for i in kept), default=0.0)


def capped_factors(claimed: Sequence[float], capped: Sequence[float]) -> list[float]:
    """f_i: 1, or for a capped claim its capped weight over the claims' median."""
    if len(claimed) < 2:
        return [1.0] * len(claimed)
    median = statistics.median(claimed)
    return [c / median if c < w else 1.0 for w, c in zip(claimed, capped, strict=True)]


def cap_to_median(weights: Sequence[float], ratio: float) -> list[float]:
    """w_i <- min(w_i, ratio · median w); unchanged (the same floats) when nobody exceeds it;
    ratio 0: off."""
    if ratio <= 0.0 or len(weights) < 2:
        return list(weights)
    bound = ratio * statistics.median(weights)
    return [min(w, bound) for w in weights]


def clip_contributions(replies: Sequence[DecodedReply], weights: Sequence[float], ratio: float,
                       record: str) -> int:
    """Bound what one reply pulls on the round's weighted mean (issue 32): its contribution
    c_i = (w_i / median w) · ||t_i|| of `record` is scaled, in place, to at most ratio · median c
    (centered clipping around the current model, Karimireddy et al. 2021). Per part screens let
    9× the median's examples with a Δ × -9 through (81× a median client); this does not. Returns
    how many replies were clipped; ratio 0 or fewer than two replies: off."""
    if ratio <= 0.0 or len(replies) < 2:
        return 0
    typical = statistics.median(weights)
    if typical <= 0.0:
        return 0
    norms = [float(flat(r.arrays[record]).norm()) for r in replies]
    contributions = [w / typical * n for w, n in zip(weights, norms, strict=True)]
    bound = ratio * statistics.median(contributions)
    clipped = 0
    for reply, c in zip(replies, contributions, strict=True):
        if c > bound and math.isfinite(c) and c > 0.0:
            scale = bound / c
            reply.arrays[record] = {k: t * scale if t.is_floating_point() else t
                                    for k, t in reply.arrays[record].items()}
            clipped += 1
    return clipped
