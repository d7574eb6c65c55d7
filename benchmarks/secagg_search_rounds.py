"""`python benchmarks/secagg_search_rounds.py`: how many failed rounds (and rounds in all) the
SecAgg+ search (adaptfl/strategies/secagg_search.py) takes to name persistent liars, the worst
over every choice of liars, under secagg-liars f = 1 and the default f = 2; the search alone,
no training (docs/secagg.md, "An input out of range"). Every node is sampled each round; a
round fails when a liar is in its cohort. About a minute on 2 cores (most of it 64 nodes)."""

from __future__ import annotations

import itertools
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from adaptfl.strategies.secagg_search import Search  # noqa: E402

LIMIT = 200  # rounds played before a case counts as never named


def hunt(count: int, liars: set[int], bound: int) -> tuple[int, int] | None:
    """(failed rounds, rounds) until every liar is excluded; None if not within LIMIT rounds
    or an honest node was excluded."""
    search, failed = Search(), 0
    for server_round in range(1, LIMIT + 1):
        cohort = search.cohort([n for n in range(1, count + 1) if n not in search.excluded], bound)
        if liars & set(cohort):
            failed += 1
            search.after_failure(server_round, cohort, bound)
            if set(search.excluded) - liars:
                return None
            if liars <= set(search.excluded):
                return failed, server_round
        else:
            search.after_pass()
    return None


def worst(count: int, liars: int, bound: int) -> str:
    outcomes = [hunt(count, set(pick), bound) for pick in itertools.combinations(range(1, count + 1), liars)]
    if any(o is None for o in outcomes):
        return f"not all named within {LIMIT} rounds"
    fails, rounds = (max(o[i] for o in outcomes if o is not None) for i in (0, 1))
    return f"{fails} failed of {rounds} rounds"


def main() -> None:
    print("| nodes | one liar, f = 1 | one liar, f = 2 | two liars, f = 2 |")
    print("|---:|---|---|---|")
    for count in (4, 5, 6, 7, 8, 10, 12, 16, 32, 64):
        two = worst(count, 2, 2) if count <= 10 else "-"
        print(f"| {count} | {worst(count, 1, 1)} | {worst(count, 1, 2)} | {two} |", flush=True)


if __name__ == "__main__":
    main()
