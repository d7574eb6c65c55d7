"""Signs of life while a run trains: `[ROUND k/N]` lines with the round's accuracy, how long it
took, the elapsed time and an ETA (as Flower's own `[ROUND k/N]` log does), and an optional
callback for a progress bar (the in-process engine's CLI draws one with tqdm)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)
Row = dict[str, Any]


def clock(seconds: float) -> str:
    """h:mm:ss or m:ss."""
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def federated(row: Row) -> str:
    """The federated evaluation's part of the line (fraction-evaluate > 0), else ''."""
    if "fed-eval-accuracy" not in row:
        return ""
    personal = f", personalised {row['fed-eval-personal-accuracy']:.4f}" \
        if "fed-eval-personal-accuracy" in row else ""
    return (f", clients' accuracy {row['fed-eval-accuracy']:.4f} (worst decile "
            f"{row['fed-eval-accuracy-p10']:.4f}){personal}")


class Progress:
    def __init__(self, num_rounds: int, first_round: int,
                 on_round: Callable[[Row], None] | None = None) -> None:
        self.num_rounds, self.first_round, self.on_round = num_rounds, first_round, on_round
        self.started = time.perf_counter()

    def round_done(self, row: Row) -> None:
        server_round = int(row["round"])
        elapsed = time.perf_counter() - self.started
        done = server_round - self.first_round + 1
        eta = elapsed / done * (self.num_rounds - server_round)
        spent = f", ε {row['dp-epsilon']:.3g}" if "dp-epsilon" in row else ""  # dp: so far, at dp-delta
        if "seconds" not in row:  # dp's release: counts and clocks tell who was slow or failed
            log.info("[ROUND %d/%d] accuracy %.4f, loss %.4f%s", server_round, self.num_rounds,
                     row["test-accuracy"], row["test-loss"], spent)
        else:
            state = "skipped (state unchanged)" if row.get("skipped") else \
                f"{row.get('replies-accepted', 0)}/{row.get('replies-sampled', 0)} replies"
            log.info("[ROUND %d/%d] accuracy %.4f, loss %.4f, %s%s%s, %.1f s (elapsed %s, ETA %s)",
                     server_round, self.num_rounds, row["test-accuracy"], row["test-loss"], state, spent,
                     federated(row), row["seconds"], clock(elapsed), clock(eta))
        if self.on_round is not None:
            self.on_round(row)
