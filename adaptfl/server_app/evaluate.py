"""Central evaluation of the global model on the task's test split."""

from __future__ import annotations

import copy
import math
import weakref

import torch

from adaptfl.client_app.device import select_device
from adaptfl.workloads import Task

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


@torch.no_grad()
def evaluate_all(model: torch.nn.Module, task: Task, device: torch.device | None = None
                 ) -> dict[str, float]:
    """test-accuracy and test-loss per prediction (top-1 accuracy for classifiers, token
    accuracy for language models); for sequence tasks with `example_nll` (SFT) also
    test-perplexity = exp(test-loss) and test-response-nll, the mean over examples of each
    example's mean response-token NLL (test-loss weights examples by their response length).
    `device`: evaluate there (`evaluation_device`), the model's own device where None."""
    if device is not None:
        model = on_device(model, device)
    model.eval()
    data = task.test
    devices = {p.device for p in model.parameters()}
    device = next(model.parameters()).device
    if len(devices) > 1:  # a shared frozen base moved by a client on another device
        model.to(device)
    correct, loss_sum, count, n, nll_sum, weight_sum = 0, 0.0, 0, len(data), 0.0, 0
    for start in range(0, n, task.eval_batch_size):
        x, y = data.batch(torch.arange(start, min(start + task.eval_batch_size, n)))
        logits = model(x.to(device))
        y = y.to(device)
        hits, predictions = task.accuracy(logits, y)
        # the task's loss is a mean: over every target, or (sequence tasks) the counted ones
        weight = predictions if task.example_nll is not None else y.numel()
        loss_sum, weight_sum = loss_sum + float(task.loss(logits, y)) * weight, weight_sum + weight
        correct, count = correct + hits, count + predictions
        if task.example_nll is not None:
            nll_sum += float(task.example_nll(logits, y).sum())
    out = {"test-accuracy": correct / max(count, 1), "test-loss": loss_sum / max(weight_sum, 1)}
    if task.example_nll is not None:
        out["test-perplexity"] = math.exp(min(out["test-loss"], 700.0))
        out["test-response-nll"] = nll_sum / max(n, 1)
    return out


def evaluate(model: torch.nn.Module, task: Task) -> tuple[float, float]:
    """(accuracy, mean loss) over the whole test split (see evaluate_all)."""
    out = evaluate_all(model, task)
    return out["test-accuracy"], out["test-loss"]
