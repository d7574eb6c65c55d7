"""Finding the node whose input put a SecAgg+ sum out of reach (fixedpoint.beyond_reach), by
group testing over the next rounds (after Dorfman 1943; binary splitting finds one defective
among n in ⌈log₂ n⌉ tests):
the sum of a cohort tells only whether some input in it was out of range, never whose.

    a round's sum fails      the suspects become its live nodes (the first failure), or those
                             of them still suspected (S ∩ live): a liar was in every failed
                             cohort, so it is in their intersection, whatever it did in between
    while ≥ 2 are suspected  each round leaves out one half of the suspects in the sample
                             (alternating halves after a sum that passes), so a failure halves S
    one suspect left         it is excluded from every later round and named in the row

The intersection is sound against one liar, even one that lies only some rounds: a passing sum
clears nobody (the liar may have behaved), so only failures narrow S. Two liars can make it
empty (the search starts again from the failed round) or, taking turns, steer it onto an honest
node (docs/secagg.md, "An input out of range"). The state lives in ServerState, so a resumed run
continues the search where it was.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TypedDict

# the least cohort a secure sum takes (secagg/server.py refuses fewer: the sum of two is each one's)
MIN_COHORT = 3
# the row's columns (server_app/columns.py declares what each means)
SUSPECTS, EXCLUDED, NARROWED = "secagg-suspects", "secagg-excluded", "secagg-narrowed"


class SearchRecord(TypedDict):
    """The search as the checkpoint holds it (plain lists and dicts: torch.load's weights_only)."""

    suspects: list[int]
    failed: list[int]
    attempt: int
    excluded: dict[int, str]


@dataclass
class Search:
    """The search's state, checkpointed with the server's (ServerState.secagg_search)."""

    suspects: list[int] = field(default_factory=list)  # one liar is among them; [] : no search
    failed: list[int] = field(default_factory=list)  # the rounds whose sums narrowed `suspects`
    attempt: int = 0  # passing rounds since the last failure: which half is left out next
    excluded: dict[int, str] = field(default_factory=dict)  # node -> why, for the rest of the run

    def as_dict(self) -> SearchRecord:
        return {"suspects": list(self.suspects), "failed": list(self.failed), "attempt": self.attempt,
                "excluded": dict(self.excluded)}

    @classmethod
    def from_dict(cls, raw: SearchRecord) -> Search:
        return cls(suspects=[int(n) for n in raw["suspects"]], failed=[int(r) for r in raw["failed"]],
                   attempt=int(raw["attempt"]), excluded={int(n): str(w) for n, w in raw["excluded"].items()})

    def clone(self) -> Search:
        return Search.from_dict(self.as_dict())

    def cohort(self, sample: list[int], least: int = MIN_COHORT) -> list[int]:
        """The round's nodes from its `sample` (excluded nodes already out): every node not
        suspected and one half of the suspects in it, the half alternating with `attempt`; more
        suspects where fewer than `least` nodes would be left (a sum needs 3)."""
        suspected = [n for n in sorted(sample) if n in set(self.suspects)]
        if len(suspected) < 2:
            return sorted(sample)
        half = math.ceil(len(suspected) / 2)
        halves = (suspected[:half], suspected[half:])
        kept, out = halves[self.attempt % 2], halves[1 - self.attempt % 2]
        cleared = [n for n in sample if n not in set(suspected)]
        while len(cleared) + len(kept) < least and out:  # too small a cohort: fewer left out
            kept, out = kept + out[:1], out[1:]
        return sorted(cleared + kept)

    def after_pass(self) -> None:
        """A sum in reach: the other half is left out next (a persistent liar is then found)."""
        if self.suspects:
            self.attempt += 1

    def after_failure(self, server_round: int, live: list[int]) -> tuple[bool, int | None]:
        """A sum out of reach among `live`: (whether the suspects narrowed, the node excluded
        now or None). A failure that leaves them as they were (every suspect in the cohort) or
        that no suspect was in (two liars) narrows nothing; the latter starts again from `live`."""
        common = [n for n in self.suspects if n in set(live)]
        if not self.suspects or not common:
            self.suspects, self.failed, self.attempt = sorted(live), [server_round], 0
            return False, self._exclude_last()
        narrowed = len(common) < len(self.suspects)
        if narrowed:
            self.suspects, self.attempt = common, 0
            self.failed.append(server_round)
        return narrowed, self._exclude_last()

    def _exclude_last(self) -> int | None:
        if len(self.suspects) != 1:
            return None
        node = self.suspects[0]
        self.excluded[node] = (f"secagg+: the sums of rounds {self.failed} were out of reach and node "
                               f"{node} was in every one; left out of every later round")
        self.suspects, self.failed, self.attempt = [], [], 0
        return node
