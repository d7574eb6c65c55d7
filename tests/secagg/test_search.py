"""The search for the nodes whose inputs put SecAgg+ sums out of reach (strategies/secagg_search.py):
under at most f = secagg-liars liars no honest node is ever excluded, whatever the liars do
(every adaptive schedule of two liars of 5 is played); one persistent liar of 4 to 16 nodes and
two of 7 are found within a stated number of failed rounds; more liars than f stop the search
with the reason; the state survives the checkpoint and the resumed search goes on exactly."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

from adaptfl.core.secagg_settings import SecAgg
from adaptfl.strategies import hitting_sets
from adaptfl.strategies.secagg_search import Search
from adaptfl.strategies.skips import RunAborted, SkipGuard
from adaptfl.strategies.state import ServerState

DEFAULT = SecAgg().secagg_liars  # f with the defaults


def explained(cohorts: list[list[int]], most: int, without: int | None = None) -> bool:
    """Whether some set of at most `most` nodes, `without` not among them, meets every cohort
    (by brute force, independent of hitting_sets.py)."""
    others = sorted({n for c in cohorts for n in c} - {without})
    return any(all(set(pick) & set(c) for c in cohorts)
               for k in range(most + 1) for pick in itertools.combinations(others, k))


def hunt(nodes: list[int], lies: Callable[[int, list[int]], bool], bound: int, rounds: int = 80
         ) -> tuple[Search, list[int]]:
    """Rounds of the search: `lies(round, cohort)` says whether the round's sum fails. Each
    exclusion is checked sound when it is made. (the search, the rounds that failed)."""
    search, failed = Search(), []
    for server_round in range(1, rounds + 1):
        cohort = search.cohort([n for n in nodes if n not in search.excluded], bound)
        assert len(cohort) >= min(3, len(nodes) - len(search.excluded))
        if not lies(server_round, cohort):
            search.after_pass()
            continue
        failed.append(server_round)
        for node in search.after_failure(server_round, cohort, bound)[1]:
            assert not explained(search.cohorts, bound, without=node), (node, search)
    return search, failed


def persistent(liars: set[int]) -> Callable[[int, list[int]], bool]:
    return lambda _round, cohort: bool(liars & set(cohort))


@pytest.mark.parametrize(("count", "bound"), [(n, 1) for n in (4, 5, 7, 10, 16)]
                         + [(n, DEFAULT) for n in (5, 6, 7, 10, 13, 16)])
def test_a_persistent_liar_is_named_within_a_bounded_number_of_failures(count: int, bound: int) -> None:
    """f = 1: 1 + ⌈log₂ n⌉ failures (one more below 5); f = 2: at most 5·⌈log₂ n⌉ (docs/secagg.md)."""
    nodes, worst = list(range(1, count + 1)), 0
    for liar in nodes:
        search, failed = hunt(nodes, persistent({liar}), bound)
        assert list(search.excluded) == [liar], (liar, search)
        assert f"node {liar} is in every set of at most secagg-liars={bound}" in search.excluded[liar]
        named_at = len(search.failed)  # no failure after it: the liar is out
        rest = [n for n in nodes if n != liar]
        assert search.cohort(rest, bound) == rest and not search.suspects(bound)  # the search is over
        worst = max(worst, named_at)
    log2 = (count - 1).bit_length()  # ⌈log₂ n⌉
    limit = 1 + log2 + (count < 5) if bound == 1 else 5 * log2
    assert worst <= limit, worst


def test_with_two_declared_a_liar_of_four_is_never_named_but_every_round_after_a_few_passes() -> None:
    """Any two of the three others would explain its failures; leaving it out, the rounds pass."""
    search, failed = hunt([1, 2, 3, 4], persistent({4}), DEFAULT, rounds=30)
    assert not search.excluded and search.suspects(DEFAULT) and len(failed) < 10, failed


@pytest.mark.parametrize("liar", [1, 3, 5])
def test_a_liar_lying_only_some_rounds_is_named_and_never_an_honest_node(liar: int) -> None:
    """It lies in every third round it is in: the passes clear nobody, it is still found."""
    seen = itertools.count()
    search, _ = hunt([1, 2, 3, 4, 5], lambda r, cohort: liar in cohort and next(seen) % 3 == 0, DEFAULT)
    assert list(search.excluded) == [liar]


def play(search: Search, liars: set[int], depth: int, server_round: int = 1, counted: int = 0) -> int:
    """Every schedule two liars could pick, seeing the cohort: in each round one of them is in,
    the sum fails or passes. No honest node is ever excluded; returns the most failures that
    counted toward max-skipped-rounds on one path."""
    assert set(search.excluded) <= liars, (liars, search)
    if depth == 0:
        return counted
    cohort = search.cohort([n for n in range(1, 6) if n not in search.excluded], DEFAULT)
    behaved = search.clone()
    behaved.after_pass()
    worst = play(behaved, liars, depth - 1, server_round + 1, counted)
    if liars & set(cohort):
        lied = search.clone()
        ruled_out, _ = lied.after_failure(server_round, cohort, DEFAULT)
        worst = max(worst, play(lied, liars, depth - 1, server_round + 1, counted + (not ruled_out)))
    return worst


@pytest.mark.parametrize("liars", list(itertools.combinations(range(1, 6), 2)))
def test_two_liars_of_five_cannot_frame_an_honest_node_nor_end_the_run(liars: tuple[int, int]) -> None:
    """Ten rounds of every adaptive schedule (up to 2^10 each): blame lands only on a liar, and
    at most one failure counts (the first), below max-skipped-rounds' default of 3."""
    assert play(Search(), set(liars), depth=10) <= 1


def framed(search: Search, liars: set[int], bound: int, depth: int, server_round: int = 1) -> list[int]:
    """The failed rounds of a schedule of `liars` that gets an honest node excluded, [] if none
    within `depth` rounds."""
    if set(search.excluded) - liars:
        return list(search.failed)
    if depth == 0:
        return []
    cohort = search.cohort([n for n in range(1, 6) if n not in search.excluded], bound)
    outcomes = [search.clone() for _ in range(1 + bool(liars & set(cohort)))]
    outcomes[0].after_pass()
    if len(outcomes) > 1:
        outcomes[1].after_failure(server_round, cohort, bound)
    paths = (framed(o, liars, bound, depth - 1, server_round + 1) for o in outcomes)
    return next((path for path in paths if path), [])


def test_under_the_intersection_rule_two_liars_taking_turns_frame_an_honest_node() -> None:
    """secagg-liars=1 is the one-liar rule: liars 1 and 2 of 5 find a schedule that excludes
    an honest node within 8 rounds; under the default, none does (above)."""
    assert framed(Search(), {1, 2}, 1, depth=8)
    assert not framed(Search(), {1, 2}, DEFAULT, depth=8)


@pytest.mark.parametrize("liars", [(1, 2), (3, 7), (2, 4), (6, 7), (1, 5)])
def test_two_persistent_liars_of_seven_are_both_named(liars: tuple[int, int]) -> None:
    search, failed = hunt(list(range(1, 8)), persistent(set(liars)), DEFAULT)
    assert sorted(search.excluded) == sorted(liars) and len(failed) <= 16, (failed, search)


def test_more_liars_than_declared_stop_the_search_with_the_reason() -> None:
    """Three persistent liars of 7 under f = 2: the search stops only when no 2 nodes explain
    the failures, says so, and counts its failures from then on."""
    search, failed = hunt(list(range(1, 8)), persistent({2, 4, 6}), DEFAULT, rounds=60)
    why = search.explained(DEFAULT)
    assert isinstance(why, str) and "more than secagg-liars=2 liars" in why, why
    for i in range(1, len(search.cohorts) + 1):  # it stopped exactly when no 2 nodes explained
        stopped = isinstance(Search(cohorts=search.cohorts[:i]).explained(DEFAULT), str)
        assert stopped != explained(search.cohorts[:i], DEFAULT), i
    assert len(failed) > 1  # (an honest node may have been excluded before: beyond f, nothing holds)
    assert search.after_failure(99, [1, 2, 3], DEFAULT) == (False, [])  # counted, nobody named
    assert search.cohort([1, 2, 3, 4, 5, 6, 7], DEFAULT) == [1, 2, 3, 4, 5, 6, 7]


def test_the_search_survives_the_checkpoint_and_goes_on_exactly() -> None:
    nodes, liar = list(range(1, 9)), 6
    search, _ = hunt(nodes, persistent({liar}), DEFAULT, rounds=4)
    assert search.cohorts and search.suspects(DEFAULT) and not search.excluded  # mid-search
    state = ServerState(server_round=4, model={}, secagg_search=search)
    back = ServerState.from_bytes(state.to_bytes()).secagg_search
    assert back == search and state.clone().secagg_search == search
    for server_round in range(5, 30):  # the same cohorts and the same outcome, round by round
        assert back.cohort(nodes, DEFAULT) == search.cohort(nodes, DEFAULT)
        cohort = search.cohort(nodes, DEFAULT)
        for s in (search, back):
            if liar in cohort:
                s.after_failure(server_round, cohort, DEFAULT)
            else:
                s.after_pass()
    assert back == search and list(back.excluded) == [liar]


def test_a_checkpoint_of_the_one_liar_search_resumes_as_its_intersection() -> None:
    back = Search.from_dict({"suspects": [1, 4, 5], "failed": [2, 3], "attempt": 1, "excluded": {9: "why"}})
    assert back.cohorts == [[1, 4, 5]] and back.failed == [2, 3] and back.excluded == {9: "why"}


def test_a_skip_that_narrowed_the_search_does_not_count_toward_max_skipped_rounds() -> None:
    """Resumed from rows too: a search's failures (about log2 n) must not end the run."""
    narrowed = {"skipped": True, "secagg-narrowed": True}
    rows = [{"round": 1, "skipped": True}, {"round": 2, **narrowed}, {"round": 3, **narrowed}]
    guard = SkipGuard(3, rows)
    guard.after_round(4, True, "out of reach", {}, [], narrowed=True)
    guard.after_round(5, True, "out of reach", {}, [])  # the second that counts
    with pytest.raises(RunAborted, match="3 consecutive"):
        guard.after_round(6, True, "out of reach", {}, [])


def test_a_search_beyond_its_work_cap_excludes_nobody_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three disjoint failed cohorts of 4 under f = 3: 1 + 4 + 16 + 64 branches, over a cap of 50."""
    monkeypatch.setattr(hitting_sets, "WORK_CAP", 50)
    hitting_sets._minimal.cache_clear()
    search = Search(cohorts=[[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]], failed=[1, 2, 3])
    why = search.explained(3)
    assert isinstance(why, str) and "stopped (more than 50 branches" in why, why
    assert search.after_failure(4, [1, 5, 9], 3) == (False, []) and not search.excluded
    assert search.cohort(list(range(1, 13)), 3) == list(range(1, 13))  # no design: nothing to learn
    monkeypatch.setattr(hitting_sets, "WORK_CAP", 100)  # within it, the same search decides
    hitting_sets._minimal.cache_clear()
    assert len(search.explained(3)) == 4 ** 3 - 3 ** 3  # one node of each, one of them in [1, 5, 9]
