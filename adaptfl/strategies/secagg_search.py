"""Finding the nodes whose inputs put SecAgg+ sums out of reach (fixedpoint.beyond_reach), by
group testing over the next rounds (after Dorfman 1943): the sum of a cohort tells only whether
some input in it was out of range, never whose, and a passing sum clears nobody (a liar may
behave when it likes).

    a round's sum fails      its live nodes join the failed cohorts, all kept; the explanations
                             are the minimal sets of at most f = secagg-liars nodes meeting every
                             failed cohort (hitting_sets.py): the liars are a superset of one
    a node in every one      it is excluded from every later round and named in the row: with at
                             most f liars, no honest node is in every explanation
    none exists              more than f liars: nobody is excluded, the row says so, the search
                             stops (its failures count toward max-skipped-rounds)
    while any is open        each round leaves out the next explanation in turn (so a round
                             can pass, training while they are out) and suspects drawn at random
                             up to half of them: a failure rules out every explanation left out

With f = 1 the explanations are the single nodes of the failed cohorts' intersection: binary
splitting, one liar among n in about 1 + log₂ n failures. With f ≥ 2 an exclusion needs, for
every f honest nodes, a failed cohort without them; two liars taking turns cannot steer it onto
an honest node (docs/secagg.md, "An input out of range"). The state lives in ServerState, so a
resumed run continues the search where it was.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import NotRequired, TypedDict

from adaptfl.strategies.hitting_sets import Explanations, TooMuchWork, explanations, forced

# the least cohort a secure sum takes (secagg/server.py refuses fewer: the sum of two is each one's)
MIN_COHORT = 3
# the row's columns (server_app/columns.py declares what each means)
SUSPECTS, EXCLUDED, NARROWED = "secagg-suspects", "secagg-excluded", "secagg-narrowed"
STOPPED = "secagg-search-stopped"


class SearchRecord(TypedDict):
    """The search as the checkpoint holds it (plain lists and dicts: torch.load's weights_only)."""

    cohorts: NotRequired[list[list[int]]]
    suspects: NotRequired[list[int]]  # a checkpoint of the one-liar search: the cohorts' intersection
    failed: list[int]
    attempt: int
    excluded: dict[int, str]


@dataclass
class Search:
    """The search's state, checkpointed with the server's (ServerState.secagg_search)."""

    cohorts: list[list[int]] = field(default_factory=list)  # the live nodes of each failed round
    failed: list[int] = field(default_factory=list)  # those rounds
    attempt: int = 0  # rounds since the last failure that ruled something out: the rotation
    excluded: dict[int, str] = field(default_factory=dict)  # node -> why, for the rest of the run

    def as_dict(self) -> SearchRecord:
        return {"cohorts": [list(c) for c in self.cohorts], "failed": list(self.failed),
                "attempt": self.attempt, "excluded": dict(self.excluded)}

    @classmethod
    def from_dict(cls, raw: SearchRecord) -> Search:
        # a checkpoint of the one-liar search kept the failed cohorts' intersection: as one cohort
        cohorts = raw.get("cohorts", [raw["suspects"]] if raw.get("suspects") else [])
        return cls(cohorts=[[int(n) for n in c] for c in cohorts], failed=[int(r) for r in raw["failed"]],
                   attempt=int(raw["attempt"]), excluded={int(n): str(w) for n, w in raw["excluded"].items()})

    def clone(self) -> Search:
        return Search.from_dict(self.as_dict())

    def explained(self, bound: int) -> Explanations | str:
        """The explanations of the failed cohorts under at most `bound` liars, or why the search
        stopped (none: more liars than declared; or too many to enumerate)."""
        try:
            sets = explanations(self.cohorts, bound)
        except TooMuchWork as why:
            return (f"secagg+: the search for the inputs out of reach stopped ({why}, "
                    f"secagg-liars={bound}); nobody more is excluded")
        if not sets:
            return (f"secagg+: no set of at most {bound} nodes meets every cohort whose sum was out of "
                    f"reach (rounds {self.failed}): more than secagg-liars={bound} liars; nobody more "
                    "is excluded")
        return sets

    def open_sets(self, bound: int) -> list[frozenset[int]]:
        """The explanations less the nodes already out, those not yet down to them ([] : no search)."""
        sets = self.explained(bound)
        if isinstance(sets, str):
            return []
        out = frozenset(self.excluded)
        return [s - out for s in sets if s - out]

    def suspects(self, bound: int) -> list[int]:
        """The nodes in some open explanation."""
        return sorted(frozenset().union(*self.open_sets(bound)))

    def cohort(self, sample: list[int], bound: int, least: int = MIN_COHORT) -> list[int]:
        """The round's nodes from its `sample` (excluded nodes already out): all but the
        explanations left out this round (at least `least` nodes stay: a sum needs 3)."""
        out = self._left_out(sample, bound, len(sample) - least)
        return sorted(n for n in sample if n not in out)

    def _left_out(self, sample: list[int], bound: int, room: int) -> frozenset[int]:
        """One explanation, the next in turn among those that fit in `room` (so the round passes
        if the liars are those), and more suspects drawn at random up to half of them (so a
        failure rules out every explanation among them: about a quarter of the pairs a round,
        where the next explanations in order would share one node); none if none fits."""
        sets = [s for s in (s & frozenset(sample) for s in self.open_sets(bound)) if len(s) <= room]
        if not sets:
            return frozenset()
        first, suspects = sets[self.attempt % len(sets)], sorted(frozenset().union(*sets))
        budget = min(room, max(len(first), len(suspects) // 2))
        draw = random.Random(len(self.cohorts) * 1_000_003 + self.attempt)  # the checkpoint's: resumes alike
        return first | frozenset(draw.sample([n for n in suspects if n not in first], budget - len(first)))

    def after_pass(self) -> None:
        """A sum in reach: clears nobody; other explanations are left out next."""
        if self.cohorts:
            self.attempt += 1

    def after_failure(self, server_round: int, live: list[int], bound: int) -> tuple[bool, list[int]]:
        """A sum out of reach among `live`: (whether it ruled an explanation out while a search
        was on, the nodes excluded now). The first failure of a search, and one that rules out
        nothing, count toward max-skipped-rounds."""
        before = self.explained(bound)
        searching = bool(self.open_sets(bound))
        self.cohorts.append(sorted(live))
        self.failed.append(server_round)
        after = self.explained(bound)
        informative = searching and after != before and not isinstance(after, str)
        self.attempt = 0 if informative else self.attempt + 1
        named = sorted(forced(after) - frozenset(self.excluded)) if not isinstance(after, str) else []
        for node in named:
            self.excluded[node] = (f"secagg+: the sums of rounds {self.failed} were out of reach and "
                                   f"node {node} is in every set of at most secagg-liars={bound} nodes "
                                   "meeting each of those cohorts; left out of every later round")
        return informative or bool(named), named
