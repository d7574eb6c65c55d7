"""The search for the node whose input put a SecAgg+ sum out of reach (strategies/secagg_search.py): group
testing over rounds finds one liar among n in about log2 n failed rounds, whatever node it is
and whether it lies every round or only some; a passing round clears nobody; the state survives
the checkpoint."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

from adaptfl.strategies.secagg_search import Search
from adaptfl.strategies.skips import RunAborted, SkipGuard
from adaptfl.strategies.state import ServerState


def hunt(nodes: list[int], lies: Callable[[int, list[int]], bool], rounds: int = 40
         ) -> tuple[Search, list[int], int]:
    """Rounds of the search over `nodes` with one liar: `lies(round, cohort)` says whether the
    round's sum fails. (the search, the rounds that failed, the round the liar was named or 0)."""
    search, failed = Search(), []
    for server_round in range(1, rounds + 1):
        cohort = search.cohort([n for n in nodes if n not in search.excluded])
        assert len(cohort) >= min(3, len(nodes) - len(search.excluded))
        if lies(server_round, cohort):
            failed.append(server_round)
            _, named = search.after_failure(server_round, cohort)
            if named is not None:
                return search, failed, server_round
        else:
            search.after_pass()
    return search, failed, 0


@pytest.mark.parametrize("count", [4, 5, 7, 10, 16])
def test_a_liar_lying_every_round_is_named_after_about_log2_n_failures(count: int) -> None:
    nodes = list(range(1, count + 1))
    worst = 0
    for liar in nodes:
        search, failed, named_at = hunt(nodes, lambda r, cohort: liar in cohort)  # noqa: B023
        assert named_at and list(search.excluded) == [liar], (liar, search)
        assert f"node {liar} was in every one" in search.excluded[liar]
        worst = max(worst, len(failed))
    # the first failure, then one per halving (a cohort of 3 at least costs one more below 5)
    assert worst <= 1 + (count - 1).bit_length() + (count < 5), worst


@pytest.mark.parametrize("liar", [1, 3, 5])
def test_a_liar_lying_only_some_rounds_is_named_and_never_an_honest_node(liar: int) -> None:
    """It lies in every third round it is in: the passes clear nobody, it is still found."""
    seen = itertools.count()
    search, _, named_at = hunt([1, 2, 3, 4, 5], lambda r, cohort: liar in cohort and next(seen) % 3 == 0)
    assert named_at and list(search.excluded) == [liar]


def test_after_the_exclusion_every_round_is_the_others() -> None:
    search, _, _ = hunt([1, 2, 3, 4, 5], lambda r, cohort: 2 in cohort)
    assert search.cohort([1, 3, 4, 5]) == [1, 3, 4, 5] and not search.suspects


def test_a_failure_no_suspect_was_in_starts_again_from_its_cohort() -> None:
    search = Search()
    search.after_failure(1, [1, 2, 3, 4, 5, 6])
    assert search.cohort([1, 2, 3, 4, 5, 6, 7]) == [1, 2, 3, 7]  # 4, 5, 6 sit out
    assert search.after_failure(2, [1, 2, 3, 7]) == (True, None) and search.suspects == [1, 2, 3]
    assert search.after_failure(3, [5, 6, 7]) == (False, None)  # two liars: a new search
    assert search.suspects == [5, 6, 7] and search.failed == [3]


def test_a_cohort_never_falls_below_three() -> None:
    search = Search(suspects=[1, 2, 3, 4])
    assert search.cohort([1, 2, 3, 4]) == [1, 2, 3]
    search.after_pass()
    assert search.cohort([1, 2, 3, 4]) == [1, 3, 4]
    search = Search(suspects=[1, 2, 3])
    assert search.cohort([1, 2, 3]) == [1, 2, 3]  # nothing to leave out: the failure narrows nothing
    assert search.after_failure(1, [1, 2, 3]) == (False, None)


def test_the_search_survives_the_checkpoint() -> None:
    state = ServerState(server_round=3, model={})
    state.secagg_search.after_failure(2, [1, 2, 3, 4, 5])
    state.secagg_search.after_failure(3, [4, 5, 1])
    state.secagg_search.excluded[9] = "why"
    back = ServerState.from_bytes(state.to_bytes()).secagg_search
    assert back == state.secagg_search and back.suspects == [1, 4, 5] and back.failed == [2, 3]
    assert state.clone().secagg_search == state.secagg_search


def test_a_skip_that_narrowed_the_search_does_not_count_toward_max_skipped_rounds() -> None:
    """Resumed from rows too: a search's failures (about log2 n) must not end the run."""
    narrowed = {"skipped": True, "secagg-narrowed": True}
    rows = [{"round": 1, "skipped": True}, {"round": 2, **narrowed}, {"round": 3, **narrowed}]
    guard = SkipGuard(3, rows)
    guard.after_round(4, True, "out of reach", {}, [], narrowed=True)
    guard.after_round(5, True, "out of reach", {}, [])  # the second that counts
    with pytest.raises(RunAborted, match="3 consecutive"):
        guard.after_round(6, True, "out of reach", {}, [])
