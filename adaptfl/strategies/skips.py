"""Skipped rounds, counted the same in adaptfl's round loop (server_app/loop.py) and under
Flower's `Strategy.start` (strategies/base.py): max-skipped-rounds consecutive, or as many within
the last skip-window rounds, or a run no round trained, end the run with `RunAborted`
(server_app/abort.py says when else a run must stop)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from adaptfl.strategies.secagg_search import NARROWED


class RunAborted(RuntimeError):
    """The run cannot produce a trustworthy model; the message says why, in one line."""


def _clip(text: str, limit: int = 200) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # terminal colours (Ray's traceback has them)
# Flower's error reason for a ClientApp that raised: "<class '…'>:<'" + the exception + "'>",
# the exception a ClientAppException whose text is "Exception … occurred. Message: " + the client's
FLOWER_WRAPPER = re.compile(r"<class '[^']*'>:<'|Traceback \(most recent call last\):?")
FLOWER_PREFIX = re.compile(r"^Exception \w+ occurred\. Message: ")


def _gist(reason: str) -> str:
    """A client's error in its own words: the text before any traceback, then the exception's
    own (last) line, without colour codes or the wrapping Flower adds in simulation."""
    lines = [line.strip() for line in ANSI.sub("", reason).splitlines() if line.strip()]
    if not lines:
        return reason
    head = FLOWER_WRAPPER.sub("", lines[0]) if len(lines) > 1 else ""
    return head + FLOWER_PREFIX.sub("", lines[-1].removesuffix("'>"))


class SkipGuard:
    """Counts skipped rounds; raises RunAborted when `limit` are consecutive or `limit` fall
    within the last `window` rounds (a run refused every other round never has 3 in a row;
    docs/threat-model.md, "Hostile clients", step 7), or at the end of a run that no round
    trained, naming the last cause. A resumed run starts from its rows, so a streak (or a run
    that never trained) carries over the interruption. window 0: 2 × limit."""

    def __init__(self, limit: int, rows: Sequence[Mapping[str, Any]] = (), window: int = 0) -> None:
        self.limit, self.streak, self.trained, self.last = limit, 0, False, "no replies"
        self.window = max(window or 2 * limit, limit)
        self.recent: list[bool] = []  # skipped?, the last `window` rounds
        for row in rows:
            if row.get("round", 0) >= 1 and not row.get(NARROWED):
                self.streak = self.streak + 1 if row.get("skipped") else 0
                self.trained = self.trained or not row.get("skipped")
                self.recent = [*self.recent, bool(row.get("skipped"))][-self.window:]

    def after_round(self, server_round: int, skipped: bool, reason: str,
                    rejected: Mapping[str, str], missing: list[int], narrowed: bool = False) -> None:
        """`narrowed`: a SecAgg+ sum out of reach that narrowed the search for its sender
        (strategies/secagg_search.py): progress towards leaving the liar out, not counted (a search takes
        about log2 n of them, bounded; one that narrows nothing counts)."""
        if narrowed:
            return
        self.streak = self.streak + 1 if skipped else 0
        self.trained = self.trained or not skipped
        self.recent = [*self.recent, skipped][-self.window:]
        if skipped:
            causes = [reason] if reason else []
            causes += [f"node {node}: {_gist(why)}" for node, why in list(rejected.items())[:2]]
            if missing:
                causes.append(f"no reply within round-timeout from nodes {missing[:5]}")
            self.last = _clip("; ".join(causes)) or "no replies"
        if self.streak >= self.limit:
            raise RunAborted(f"run aborted after round {server_round}: {self.streak} consecutive "
                             f"rounds skipped (max-skipped-rounds={self.limit}); last round: {self.last}")
        if sum(self.recent) >= self.limit:
            raise RunAborted(f"run aborted after round {server_round}: {sum(self.recent)} of the last "
                             f"{len(self.recent)} rounds skipped (max-skipped-rounds={self.limit}, "
                             f"skip-window={self.window}); last skipped round: {self.last}")

    def at_end(self, num_rounds: int) -> None:
        if num_rounds and not self.trained:
            raise RunAborted(f"run aborted: all {num_rounds} rounds were skipped, the model is the "
                             f"initial one; last round: {self.last}")
