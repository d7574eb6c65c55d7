"""The lr over rounds, as `torch.optim.lr_scheduler` users write it, stepped once per round: each
schedule declared once here (its factor, the keys it reads, whether it depends on the number of
rounds); `lr-schedule`'s choices, the checks and docs/algorithms.md's key table come from it.

    cosine       0.5·(1 + cos(π·(r−1)/R))          (to 0 after the last round; CosineAnnealingLR)
    constant     1
    step         γ^⌊(r−1)/lr-step-every⌋           (StepLR, step_size in rounds)
    multistep    γ^|{m ∈ lr-milestones : m ≤ r}|   (MultiStepLR: from round m on)
    exponential  γ^(r−1)                            (ExponentialLR)

with γ = `lr-gamma`, r the round (1-based) and R `num-server-rounds`. Flower's `advanced-pytorch`
halves its lr at round 5: `lr-schedule='multistep' lr-milestones='5' lr-gamma=0.5`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Schedule:
    factor: Callable[[int, int, float, int, tuple[int, ...]], float]  # (r, R, γ, every, milestones)
    reads: tuple[str, ...] = ()  # the keys only this schedule (and others listing them) reads
    needs_rounds: bool = False  # recomputed when num-server-rounds changes (a resume with more)


SCHEDULES: dict[str, Schedule] = {
    "cosine": Schedule(lambda r, n, g, e, m: 0.5 * (1.0 + math.cos(math.pi * (r - 1) / n)),
                       needs_rounds=True),
    "constant": Schedule(lambda r, n, g, e, m: 1.0),
    "step": Schedule(lambda r, n, g, e, m: g ** ((r - 1) // e), ("lr-gamma", "lr-step-every")),
    "multistep": Schedule(lambda r, n, g, e, m: g ** sum(1 for x in m if x <= r),
                          ("lr-gamma", "lr-milestones")),
    "exponential": Schedule(lambda r, n, g, e, m: g ** (r - 1), ("lr-gamma",)),
}


_REQUIRED = {"lr-step-every": "lr-step-every=5", "lr-milestones": "lr-milestones='5'"}  # no default


def parse_milestones(text: str) -> tuple[int, ...]:
    """'5,8' -> (5, 8): rounds >= 2, increasing; a one-line ValueError naming the key."""
    parts = [p.strip() for p in text.replace(" ", ",").split(",") if p.strip()]
    if not all(p.isdigit() for p in parts):
        raise ValueError(f"invalid lr-milestones={text!r}: comma-separated round numbers, e.g. '5,8'")
    rounds = tuple(int(p) for p in parts)
    if any(r < 2 for r in rounds) or list(rounds) != sorted(set(rounds)):
        raise ValueError(f"invalid lr-milestones={text!r}: rounds >= 2 (round 1 runs at lr), "
                         "increasing, each once")
    return rounds


def check_schedule(schedule: str, set_keys: dict[str, object]) -> None:
    """A key of another schedule set (`lr-gamma` under cosine) is refused; a schedule's own
    required key missing too. `set_keys`: the schedule keys set away from their defaults."""
    reads = SCHEDULES[schedule].reads
    for key, value in set_keys.items():
        if key not in reads:
            readers = [name for name, s in SCHEDULES.items() if key in s.reads]
            raise ValueError(f"{key}={value!r} is read only by lr-schedule {' or '.join(map(repr, readers))} "
                             f"(lr-schedule={schedule!r}); remove it or choose that schedule")
    for key in reads:
        if key in _REQUIRED and key not in set_keys:
            raise ValueError(f"lr-schedule={schedule!r} needs {key} (e.g. {_REQUIRED[key]})")


def round_lr_scale(schedule: str, server_round: int, num_rounds: int, gamma: float = 0.1,
                   step_every: int = 1, milestones: str = "") -> float:
    """The lr factor of a round under `schedule` (the table above)."""
    rounds = parse_milestones(milestones) if milestones else ()
    return SCHEDULES[schedule].factor(server_round, num_rounds, gamma, max(step_every, 1), rounds)
