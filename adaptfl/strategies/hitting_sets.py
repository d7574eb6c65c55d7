"""The explanations of a SecAgg+ search's failed cohorts: every minimal set of at most f nodes
that meets each of them (a hitting set; Karp 1972). Whoever sent the inputs out of range meets
every failed cohort, so if at most f nodes lie, a node in EVERY such set is one of them, and
no honest node is: the only exclusion that is sound under the bound (docs/secagg.md, "An input
out of range").

Found by the bounded search tree of parameterised complexity (Downey & Fellows 1999, §3.1):
take a cohort the set so far misses, branch on each of its nodes, at most f deep, so at most
c + c² + … + c^f branches for cohorts of c nodes. WORK_CAP bounds them; a search beyond it
decides nothing that round (nobody is excluded).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import lru_cache

# branches one search may explore: f = 2 over cohorts of 100 nodes takes 10,101; f = 3 over
# cohorts of 30 takes 27,931; beyond, the round excludes nobody and the row says why
WORK_CAP = 50_000

Explanations = tuple[frozenset[int], ...]


class TooMuchWork(Exception):
    """The search tree has more than WORK_CAP branches."""


def explanations(cohorts: Iterable[Iterable[int]], most: int) -> Explanations:
    """Every minimal set of at most `most` nodes meeting each cohort, ordered by size, then by
    its nodes; () when none exists (more than `most` liars). Raises TooMuchWork."""
    found = _minimal(_reduced(cohorts), most)
    if found is None:
        raise TooMuchWork(f"more than {WORK_CAP} branches")
    return found


def _reduced(cohorts: Iterable[Iterable[int]]) -> tuple[frozenset[int], ...]:
    """The cohorts no other one is inside (a set meeting the smaller meets the larger)."""
    unique = sorted({frozenset(c) for c in cohorts}, key=lambda c: (len(c), sorted(c)))
    return tuple(c for i, c in enumerate(unique) if not any(o < c for o in unique[:i]))


@lru_cache(maxsize=64)  # a round asks several times of the same cohorts; None (capped) is kept too
def _minimal(cohorts: tuple[frozenset[int], ...], most: int) -> Explanations | None:
    found: set[frozenset[int]] = set()
    visited: set[frozenset[int]] = set()

    def grow(chosen: frozenset[int]) -> None:
        if chosen in visited:
            return
        visited.add(chosen)
        if len(visited) > WORK_CAP:
            raise TooMuchWork
        missed = [c for c in cohorts if not c & chosen]
        if not missed:
            found.add(chosen)
        elif len(chosen) < most:
            smallest: frozenset[int] = min(missed, key=lambda c: len(c))  # the fewest branches
            for node in sorted(smallest):
                grow(chosen | {node})

    try:
        grow(frozenset())
    except TooMuchWork:
        return None
    minimal = [s for s in found if all(_misses(cohorts, s - {n}) for n in s)]
    return tuple(sorted(minimal, key=lambda s: (len(s), sorted(s))))


def _misses(cohorts: Sequence[frozenset[int]], nodes: frozenset[int]) -> bool:
    return any(not c & nodes for c in cohorts)


def forced(sets: Explanations) -> frozenset[int]:
    """The nodes in every explanation (none when there is none)."""
    return frozenset.intersection(*sets) if sets else frozenset()
