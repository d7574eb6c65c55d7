"""Does a paper's claimed ordering hold in our numbers? Read from the grid's [paper] table:

    better = ["fedact", "fedadamw"]      # claimed best first
    metric = "final-test-loss"           # a table column; loss, perplexity, nll: lower is better
    gap-largest-at = "dirichlet-alpha=min"   # optional: where the claimed gap should be largest
    pairs = [["fedpac-soap", "local-soap"], ["fedpac-muon", "local-muon"]]  # instead of `better`:
                                                                            # independent pairs
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from adaptfl.harness.stats import Row, Setting, Summary, final, group

AXIS_INDEX = {"dirichlet-alpha": 0, "fraction-train": 1}


@dataclass(frozen=True)
class Comparison:
    setting: Setting
    winner: str  # the claimed better algorithm
    loser: str
    winner_value: Summary
    loser_value: Summary
    gain: float  # in the claim's direction: > 0 means the claim holds here
    within_noise: bool  # |gain| smaller than the larger of the two seed spreads


@dataclass(frozen=True)
class ClaimCheck:
    comparisons: list[Comparison]
    holds: bool  # the ordering holds in every setting
    gap_where_claimed: bool | None  # None when the grid names no place or has one setting
    verdict: str
    gap_resolved: bool = True  # the largest gap exceeds every other by one seed standard deviation


def lower_is_better(metric: str) -> bool:
    """Losses, perplexity and response NLL (SFT) are lower-better; accuracies higher-better."""
    return any(word in metric for word in ("loss", "perplexity", "nll"))


def check_claim(paper: dict[str, Any], rows: list[Row]) -> ClaimCheck | None:
    """None when the grid states no claim or the claimed algorithms have no rows yet."""
    better, metric = paper.get("better") or [], paper.get("metric", "final-test-accuracy")
    pairs = paper.get("pairs") or list(zip(better, better[1:], strict=False))
    if not pairs:
        return None
    sign = -1.0 if lower_is_better(metric) else 1.0
    comparisons = []
    for setting, by_algorithm in sorted(group(rows).items()):
        for winner, loser in pairs:
            if winner not in by_algorithm or loser not in by_algorithm:
                continue
            w, lo = final(by_algorithm[winner], metric), final(by_algorithm[loser], metric)
            gain = sign * (w.mean - lo.mean)
            comparisons.append(Comparison(setting, winner, loser, w, lo, gain,
                                          abs(gain) < max(w.std, lo.std)))
    if not comparisons:
        return None
    holds = all(c.gain > 0 for c in comparisons)
    gap = _gap_where_claimed(paper.get("gap-largest-at", ""), comparisons)
    resolved = gap is None or _gap_resolved(comparisons)
    return ClaimCheck(comparisons, holds, gap, _verdict(holds, gap, comparisons, resolved), resolved)


def _gap_where_claimed(where: str, comparisons: list[Comparison]) -> bool | None:
    if not where or len({c.setting for c in comparisons}) < 2:
        return None
    axis, _, end = where.partition("=")
    if axis not in AXIS_INDEX or end not in ("min", "max"):
        raise ValueError(f"gap-largest-at={where!r}: expected <dirichlet-alpha|fraction-train>=<min|max>")
    index = AXIS_INDEX[axis]
    pick = min if end == "min" else max
    target = pick(c.setting[index] for c in comparisons)
    largest = max(comparisons, key=lambda c: c.gain)
    return largest.setting[index] == target


def _gap_resolved(comparisons: list[Comparison]) -> bool:
    """Whether the largest gain exceeds the next largest by more than the larger seed standard
    deviation of the four runs' summaries behind them (else "largest" is within noise)."""
    ranked = sorted(comparisons, key=lambda c: c.gain, reverse=True)
    first, second = ranked[0], ranked[1]
    spread = max(v.std for c in (first, second) for v in (c.winner_value, c.loser_value))
    return first.gain - second.gain > spread


def _tied(c: Comparison) -> bool:
    """Equal means up to float rounding (a mean of counts, summed in another order)."""
    return abs(c.gain) <= 1e-9 * max(1.0, abs(c.winner_value.mean), abs(c.loser_value.mean))


def _verdict(holds: bool, gap: bool | None, comparisons: list[Comparison], resolved: bool = True) -> str:
    noisy = sum(c.within_noise for c in comparisons)
    if holds and noisy == len(comparisons):
        text = ("**not resolved**: the claimed order appears in the means of every setting, but no "
                "gap exceeds one seed standard deviation")
        noisy = 0  # already said
    elif holds:
        text = "**holds**: the claimed order appears in every comparison"
    elif any(c.gain > 0 for c in comparisons):
        text = "**holds only in part**: the claimed order appears in some comparisons, not in others"
    elif all(_tied(c) for c in comparisons):  # e.g. the same count of correct tokens
        text = "**tied**: the means are equal in every comparison"
        noisy, gap = 0, None  # no gap to place
    elif any(_tied(c) for c in comparisons):
        text = "**does not hold** here: the claimed order is reversed or tied in every comparison"
    else:
        text = "**does not hold** here: the claimed order is reversed in every comparison"
    if noisy:
        text += f" ({noisy} of {len(comparisons)} gaps are within one seed standard deviation)"
    return text + _gap_clause(gap, resolved) + "."


def _gap_clause(gap: bool | None, resolved: bool) -> str:
    if gap is None:
        return ""
    if not resolved:
        return ("; where the gap is largest is **not resolved** (the largest exceeds the next by "
                "less than one seed standard deviation)")
    return "; the gap is " + ("largest" if gap else "**not** largest") + " where the paper says"
