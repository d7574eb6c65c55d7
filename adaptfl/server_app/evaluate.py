"""Central evaluation of the global model on the task's test split (workloads/scoring.py)."""

from __future__ import annotations

import torch

from adaptfl.workloads import Task
from adaptfl.workloads.scoring import score


def evaluate_all(model: torch.nn.Module, task: Task) -> dict[str, float]:
    """test-accuracy, test-loss (and for SFT tasks test-perplexity, test-response-nll) on the
    whole test split: `score` with its defaults."""
    return score(model, task)


def evaluate(model: torch.nn.Module, task: Task) -> tuple[float, float]:
    """(accuracy, mean loss) over the whole test split (see evaluate_all)."""
    out = evaluate_all(model, task)
    return out["test-accuracy"], out["test-loss"]
