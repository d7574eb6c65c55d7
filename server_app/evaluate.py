"""Central evaluation of the global model on the task's test split."""

from __future__ import annotations

import torch
from adaptfl.workloads import Task


@torch.no_grad()
def evaluate(model: torch.nn.Module, task: Task, batch_size: int = 1000) -> tuple[float, float]:
    """(accuracy, mean loss) over the whole test split, per prediction: top-1 accuracy for
    classifiers, token accuracy for language models (exp(loss) is the perplexity)."""
    model.eval()
    data = task.test
    device = next(model.parameters()).device
    correct, loss_sum, count, n = 0, 0.0, 0, len(data)
    for start in range(0, n, batch_size):
        x, y = data.batch(torch.arange(start, min(start + batch_size, n)))
        logits = model(x.to(device))
        y = y.to(device)
        loss_sum += float(task.loss(logits, y)) * y.numel()  # the task's loss is a mean
        hits, predictions = task.accuracy(logits, y)
        correct, count = correct + hits, count + predictions
    return correct / max(count, 1), loss_sum / max(count, 1)
