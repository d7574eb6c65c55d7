"""Numbers a report shows, from results-table rows: grouped by setting and algorithm, over seeds."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass

from adaptfl.harness.table import series

Row = dict[str, str]
Setting = tuple[float, float]  # (dirichlet-alpha, fraction-train)


@dataclass(frozen=True)
class Summary:
    mean: float
    std: float  # sample std over seeds (0 with one seed)
    n: int

    def __str__(self) -> str:
        return f"{self.mean:.4f} ± {self.std:.4f}"


def summary(values: list[float]) -> Summary:
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return Summary(float("nan"), float("nan"), 0)
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return Summary(statistics.fmean(values), std, len(values))


def setting_of(row: Row) -> Setting:
    return float(row["dirichlet-alpha"]), float(row["fraction-train"])


def group(rows: list[Row]) -> dict[Setting, dict[str, list[Row]]]:
    """setting -> algorithm -> rows (one per seed), in the table's order of first appearance."""
    out: dict[Setting, dict[str, list[Row]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        out[setting_of(row)][row["algorithm"]].append(row)
    return out


def final(rows: list[Row], metric: str) -> Summary:
    """`metric` is a table column (e.g. final-test-accuracy)."""
    return summary([float(r[metric]) for r in rows])


def rounds_to_target(rows: list[Row], target: float, metric: str = "test-accuracy"
                     ) -> tuple[Summary, int]:
    """(rounds until `metric` first reaches `target`, over the seeds that reach it; how many
    seeds reached it). Rounds count from 1; a loss reaches its target from above."""
    lower = "loss" in metric
    hits = []
    for row in rows:
        values = series(row, metric)
        first = next((i + 1 for i, a in enumerate(values) if (a <= target if lower else a >= target)),
                     None)
        if first is not None:
            hits.append(float(first))
    return summary(hits), len(hits)


def mean_per_round(rows: list[Row], metric: str) -> Summary:
    """A per-round metric averaged over rounds, then summarised over seeds (bytes per round)."""
    return summary([statistics.fmean(s) for r in rows if (s := series(r, metric))])


def last_round(rows: list[Row], metric: str) -> Summary:
    return summary([s[-1] for r in rows if (s := series(r, metric))])


def curve(rows: list[Row], metric: str) -> tuple[list[float], list[float]]:
    """(mean, std) per round over seeds; rounds where only some seeds report are skipped."""
    runs = [series(r, metric) for r in rows]
    runs = [s for s in runs if s]
    if not runs:
        return [], []
    length = min(len(s) for s in runs)
    per_round = [summary([s[i] for s in runs]) for i in range(length)]
    return [p.mean for p in per_round], [p.std for p in per_round]
