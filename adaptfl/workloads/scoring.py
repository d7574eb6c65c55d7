"""A model's scores on rows of a split: the server's central evaluation (the whole test split)
and a client's federated evaluation (its own held-out rows, held_out.py) are the same function."""

from __future__ import annotations

import math

import torch

from adaptfl.workloads.task import Split, Task


@torch.no_grad()
def score(model: torch.nn.Module, task: Task, split: Split | None = None,
          rows: torch.Tensor | None = None) -> dict[str, float]:
    """test-accuracy and test-loss per prediction on `rows` of `split` (default: the whole test
    split): top-1 accuracy for classifiers, token accuracy for language models; for sequence
    tasks with `example_nll` (SFT) also test-perplexity = exp(test-loss) and test-response-nll,
    the mean over examples of each example's mean response-token NLL (test-loss weights examples
    by their response length)."""
    model.eval()
    data = task.test if split is None else split
    order = torch.arange(len(data)) if rows is None else rows
    devices = {p.device for p in model.parameters()}
    device = next(model.parameters()).device
    if len(devices) > 1:  # a shared frozen base moved by a client on another device
        model.to(device)
    correct, loss_sum, count, n, nll_sum, weight_sum = 0, 0.0, 0, len(order), 0.0, 0
    for start in range(0, n, task.eval_batch_size):
        x, y = data.batch(order[start:start + task.eval_batch_size])
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
