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
from typing import Any

import torch

from adaptfl.core.exit_codes import ABORTED_EXIT_CODE
from adaptfl.strategies.skips import RunAborted, SkipGuard

__all__ = ["EXIT_CODE", "RunAborted", "SkipGuard", "check_final_model", "fell_below_start"]

EXIT_CODE = ABORTED_EXIT_CODE  # `python -m adaptfl.engine`: every code in core/exit_codes.py


def fell_below_start(rows: Sequence[Mapping[str, Any]], where: str = "metrics.jsonl") -> str | None:
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
