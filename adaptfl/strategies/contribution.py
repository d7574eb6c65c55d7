"""The contribution bound (docs/robustness.md, "Contribution bound"): what one reply
can pull on the round's weighted mean, whatever it claims and sends inside the per-part screens.

    c    = the coordinate-wise median of the round's kept replies (per array of the record)
    d_i  = t_i - c                              its deviation from that center
    k_i  = (w_i / median_j w_j) · ||d_i||       its weighted deviation
    t_i <- c + d_i · min(1, r · median_j k_j / k_i)

The mean of the clipped replies is c + Σ w_i d_i / Σ w: one reply's own term is at most r times
the median reply's, and a large weight can only draw the rest of the mean towards c, which
stays within the range of the honest values per coordinate while fewer than half of the replies
are hostile. Centered clipping (Karimireddy, He and Jaggi 2021, "Learning from History for
Byzantine Robust Optimization") around this robust center rather than around the current model:
clipped around the model, a reply flipped just under the bound (weight 2× the median, Δ × -0.9)
still reversed a third of the honest step and cost 0.065-0.09 of accuracy; around the median it
pulls only by its distance from the others (benchmarks/contribution_bound.py).

A round with nothing above the bound keeps every reply as it was (the same tensors), so such a
round is bit-identical to one with the bound off.

A round of one or two replies has no median to trust (two are equally far from their mean, one
from itself), so there each reply is bounded against the history of earlier kept replies
(screen.py `HISTORY`, in the server state: checkpointed and resumed) instead:

    k_i = (w_i / median of the history's claims) · ||t_i||
    t_i <- t_i · min(1, median of the history's sizes of t / k_i)

centered at the current model (t = 0), since no center of this round is honest for sure, and at
the history's median itself (SMALL_ROUND_RATIO), not r times it: of two replies, one above the
other's size decides the direction of the mean, so a flipped reply r× a typical one reverses
the round (measured, benchmarks/small_rounds.py: fedavg, one reply a round, flip × 9: -0.215 of
accuracy at 2×, -0.115 at 1×); at 1× it can at most cancel an honest one. Only the size is held,
not the direction. Until the history holds MIN_SAMPLES replies such a round is not bounded (one
sample may be a liar's).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

import torch

from adaptfl.algorithms.config import RunConfig
from adaptfl.algorithms.sampling import fewest_replies, hostile_count
from adaptfl.server_rules.aggregators.median import coordinate_median
from adaptfl.server_rules.aggregators.trimmed_mean import TrimmedMean
from adaptfl.strategies.screen import CLAIMS, MIN_SAMPLES, WINDOW, history_median, record_sizes
from adaptfl.strategies.validation import DecodedReply

SMALL_ROUND_RATIO = 1.0  # a reply of a round of one or two: at most the history's median size

# values per slice of the median (n replies × its coordinates): about 16 MB of float32 beside
# the replies, whatever the model and the number of replies, instead of n × the model
SLICE = 1 << 22


def center(arrays: Sequence[torch.Tensor]) -> torch.Tensor:
    """The coordinate-wise median of equally shaped arrays (the mean of the two middle values
    for an even count), computed in slices of SLICE values."""
    flats = [a.reshape(-1) for a in arrays]
    out = torch.empty_like(flats[0])
    step = max(1, SLICE // len(flats))
    for start in range(0, out.numel(), step):
        scratch = torch.stack([f[start:start + step] for f in flats])
        out[start:start + step] = coordinate_median(scratch, reorder=True)
    return out.view_as(arrays[0])


def deviation_norm(record: dict[str, torch.Tensor], middle: dict[str, torch.Tensor]) -> float:
    """||t - c|| over the record's floating arrays, summed in float64."""
    total = sum(float(torch.linalg.vector_norm(record[k] - c, dtype=torch.float64)) ** 2
                for k, c in middle.items())
    return math.sqrt(total)


def clip_contributions(replies: Sequence[DecodedReply], weights: Sequence[float], ratio: float,
                       record: str) -> set[int]:
    """Clip each reply's `record` (in place) to at most `ratio` × the round's median weighted
    deviation from the round's coordinate-wise median; the indices of the replies clipped.
    ratio 0 or fewer than three replies: nothing (two are equally far from their mean, so a
    liar cannot be told from the other reply there)."""
    if ratio <= 0.0 or len(replies) < 3:
        return set()
    typical = statistics.median(weights)
    if typical <= 0.0:
        return set()
    parts = [r.arrays[record] for r in replies]
    middle = {k: center([p[k] for p in parts]) for k, t in parts[0].items() if t.is_floating_point()}
    weighted = [w / typical * deviation_norm(p, middle) for w, p in zip(weights, parts, strict=True)]
    bound = ratio * statistics.median(weighted)
    clipped: set[int] = set()
    for i, (reply, k) in enumerate(zip(replies, weighted, strict=True)):
        if k > bound and math.isfinite(k):
            scale = bound / k
            reply.arrays[record] = {name: middle[name] + (t - middle[name]) * scale if name in middle else t
                                    for name, t in reply.arrays[record].items()}
            clipped.add(i)
    return clipped


def clip_to_history(replies: Sequence[DecodedReply], weights: Sequence[float], ratio: float,
                    record: str, history: dict[str, list[float]]) -> set[int]:
    """A round of one or two replies: scale each reply's `record` (in place) so that its weight
    over the history's median claim times its size is at most `ratio` (SMALL_ROUND_RATIO where
    the bound is on) × the history's median size of `record`; the indices scaled. Nothing while
    the history is young (MIN_SAMPLES)."""
    sizes, claims = history.get(record, []), history.get(CLAIMS, [])
    if ratio <= 0.0 or len(sizes) < MIN_SAMPLES or len(claims) < MIN_SAMPLES:
        return set()
    typical, bound = history_median(claims), ratio * history_median(sizes)
    if typical <= 0.0 or bound <= 0.0:
        return set()
    norms = record_sizes([{record: r.arrays[record]} for r in replies])[record]
    clipped: set[int] = set()
    for i, (reply, w, size) in enumerate(zip(replies, weights, norms, strict=True)):
        k = w / typical * size
        if k > bound and math.isfinite(k):
            scale = bound / k
            reply.arrays[record] = {name: t * scale if t.is_floating_point() else t
                                    for name, t in reply.arrays[record].items()}
            clipped.add(i)
    return clipped


def small_round_note(cfg: RunConfig, sampled: int, nodes: int) -> str | None:
    """One line, before round 1, for a run whose rounds sample fewer than three replies: what
    bounds one reply there, what a hostile one still does, and the setting that bounds more
    (docs/robustness.md, "Rounds of one and two replies"); None otherwise."""
    if sampled >= 3:
        return None
    fed = cfg.federation
    rounds = f"fraction-train={fed.fraction_train:g} samples {sampled} of {nodes} nodes a round"
    more = f"{more_nodes(nodes, 3)} (3 of {nodes} a round)" if nodes >= 3 else "3 or more nodes a round"
    if cfg.privacy.on or cfg.secagg.on or (fed.max_contribution_ratio <= 0 and fed.screen_ratio <= 0):
        return f"{rounds}, and no reply bound is on: one hostile reply can set a round's whole update"
    effect = "reverses" if sampled == 1 else "cancels"
    return (f"{rounds}: no round median to bound a reply by; each reply's size is bounded by the "
            f"median of the last {WINDOW} kept replies once {MIN_SAMPLES} are kept (before that by "
            f"its value domains alone), not its direction: a hostile client {effect} every round "
            f"it is sampled in (measured, one a round: up to -0.5 of accuracy); {more} bounds "
            "each reply by its round's median (docs/robustness.md, 'Rounds of one and two replies')")


def tolerance_note(cfg: RunConfig, sampled: int, nodes: int) -> str:
    """One line, before round 1: how many hostile replies of a round the run's aggregator holds,
    and which setting holds more, named whole, so that it is accepted as written
    (docs/robustness.md, "Colluders at the bound")."""
    fed, rule = cfg.federation, cfg.algorithm.aggregator.name
    if rule in ("trimmed-mean", "krum") and fed.hostile_fraction > 0:
        held = hostile_count(fed.hostile_fraction, sampled)
        return (f"aggregator={rule!r} hostile-fraction={fed.hostile_fraction:g} tolerates {held} "
                f"hostile replies of the {sampled} a round samples")
    if rule == "median":
        return f"aggregator='median' tolerates fewer than half of the {sampled} replies a round hostile"
    head = f"aggregator={rule!r} bounds one hostile reply a round, not several colluding ones; "
    if nodes < TRIMMED_REPLIES:
        return head + f"no aggregator holds colluders among {nodes} nodes (3 or more are needed)"
    fix = f"aggregator='trimmed-mean' hostile-fraction={SUGGESTED_FRACTION:g} min-replies={TRIMMED_REPLIES}"
    if sampled < TRIMMED_REPLIES:
        fix += f" {more_nodes(nodes, TRIMMED_REPLIES)}"
    count = max(sampled, TRIMMED_REPLIES)
    more = min(hostile_count(SUGGESTED_FRACTION, count), (count - 1) // 2)
    return (head + f"{fix} tolerates {more} of the {count} a round would sample (docs/robustness.md, "
            "'Colluders at the bound')")


def more_nodes(nodes: int, wanted: int) -> str:
    """fraction-train=<f> that samples `wanted` of `nodes` a round (sample_size rounds f·N)."""
    return f"fraction-train={math.ceil(100 * wanted / nodes) / 100:g}"


# what the tolerance note suggests: trimmed-mean's cut at 0.3 of the replies, with the fewest
# min-replies its own check accepts at that fraction (sampling.fewest_replies: 3)
SUGGESTED_FRACTION = 0.3
TRIMMED_REPLIES = fewest_replies(TrimmedMean().check_federation, SUGGESTED_FRACTION) or 3
