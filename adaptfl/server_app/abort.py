"""When a run must stop with a non-zero exit instead of "completing" with a model nobody trained.

    max-skipped-rounds consecutive rounds skipped or refused,  (every client failing, a hostile
    or as many within the last skip-window rounds               majority, a config no client runs)
    a run whose every round was skipped                        (a short run never reaches the
                                                                limit above: its model is untrained)
    fewer nodes than min-replies needs after node-wait seconds
    a final model that is not finite

The run's results dir keeps the metrics rows and the checkpoint of the last complete round, so
`resume=true` can continue once the cause is fixed; no model.pt is written. The ServerApp raises
`RunAborted`, so Flower marks the run failed (scripts/main_job.sh then exits 1); the in-process
engine's CLI exits with `EXIT_CODE`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from adaptfl.core.exit_codes import ABORTED_EXIT_CODE

EXIT_CODE = ABORTED_EXIT_CODE  # `python -m adaptfl.engine`: every code in core/exit_codes.py


class RunAborted(RuntimeError):
    """The run cannot produce a trustworthy model; the message says why, in one line."""


def _clip(text: str, limit: int = 200) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _gist(reason: str) -> str:
    """A client's error without its traceback: what precedes it and the exception's own line."""
    head, sep, _ = reason.partition("Traceback (most recent call last)")
    return head + reason.strip().splitlines()[-1] if sep else reason


class SkipGuard:
    """Counts skipped rounds; raises RunAborted when `limit` are consecutive or `limit` fall
    within the last `window` rounds (issue 21 §3: a run refused every other round never had 3 in
    a row), or at the end of a run that no round trained, naming the last cause. A resumed run
    starts from its rows, so a streak (or a run that never trained) carries over the
    interruption. window 0: 2 × limit."""

    def __init__(self, limit: int, rows: Sequence[Mapping] = (), window: int = 0) -> None:
        self.limit, self.streak, self.trained, self.last = limit, 0, False, "no replies"
        self.window = max(window or 2 * limit, limit)
        self.recent: list[bool] = []  # skipped?, the last `window` rounds
        for row in rows:
            if row.get("round", 0) >= 1:
                self.streak = self.streak + 1 if row.get("skipped") else 0
                self.trained = self.trained or not row.get("skipped")
                self.recent = [*self.recent, bool(row.get("skipped"))][-self.window:]

    def after_round(self, server_round: int, skipped: bool, reason: str,
                    rejected: Mapping[str, str], missing: list[int]) -> None:
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


def fell_below_start(rows: Sequence[Mapping], where: str = "metrics.jsonl") -> str | None:
    """A warning line if the final model tests worse than the initial one (round 0), naming the
    round from which the accuracy stayed below it; None otherwise (or without round 0). `where`:
    the file with the rounds' rejected replies (under dp the confidential one)."""
    scored = [(int(r["round"]), float(r["test-accuracy"])) for r in rows if "test-accuracy" in r]
    if len(scored) < 2 or scored[0][0] != 0 or scored[-1][1] >= scored[0][1]:
        return None
    start = scored[0][1]
    fell = next(rnd for i, (rnd, _) in enumerate(scored)
                if all(acc < start for _, acc in scored[i:]))
    return (f"the final model's test accuracy {scored[-1][1]:.4f} is below the initial model's "
            f"{start:.4f}: it fell below in round {fell} and stayed there (see that round's "
            f"rejected replies, screen-ratio-max and weights-capped in {where})")


def check_final_model(model: Mapping[str, torch.Tensor]) -> None:
    bad = [n for n, t in model.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        raise RunAborted(f"run aborted: the final model has non-finite values in {bad[:3]}")
