"""Central evaluation of the global model on the task's test split (workloads/scoring.py)."""

from __future__ import annotations

import copy
import weakref

import torch

from adaptfl.client_app.device import select_device
from adaptfl.workloads import Task
from adaptfl.workloads.scoring import score

# the server model's copy on the evaluation device, per model (refreshed from it each round)
_twins: weakref.WeakKeyDictionary[torch.nn.Module, torch.nn.Module] = weakref.WeakKeyDictionary()


def evaluation_device(choice: str) -> torch.device:
    """Where the server evaluates: the run's `device` where this process has it (a GPU in the
    in-process engine or on a GPU server), else the CPU; never a reason to fail a run."""
    try:
        return select_device(choice)
    except ValueError:
        return torch.device("cpu")


def on_device(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """`model` itself where it is on `device`, else its twin there with `model`'s current
    weights (made once, then refreshed by one copy of the state a round)."""
    here = next(model.parameters()).device
    if here == device:
        return model
    twin = _twins.get(model)
    if twin is None:
        _twins[model] = twin = copy.deepcopy(model).to(device)
    else:
        twin.load_state_dict(model.state_dict())
    return twin


def evaluate_all(model: torch.nn.Module, task: Task, device: torch.device | None = None
                 ) -> dict[str, float]:
    """test-accuracy, test-loss (and for SFT tasks test-perplexity, test-response-nll) on the
    whole test split: `score` with its defaults; `device`: evaluate there (`evaluation_device`),
    the model's own device where None."""
    return score(model if device is None else on_device(model, device), task)


def evaluate(model: torch.nn.Module, task: Task) -> tuple[float, float]:
    """(accuracy, mean loss) over the whole test split (see evaluate_all)."""
    out = evaluate_all(model, task)
    return out["test-accuracy"], out["test-loss"]
