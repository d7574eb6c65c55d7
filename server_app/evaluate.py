"""Central evaluation of the global model on the task's test split."""

from __future__ import annotations

import torch
from adaptfl.workloads import TaskData, count_correct, task_loss


@torch.no_grad()
def evaluate(model: torch.nn.Module, data: TaskData, batch_size: int = 1000) -> tuple[float, float]:
    """(accuracy, mean cross-entropy loss) over the whole split; per token for language models
    (token accuracy, and exp(loss) is the perplexity)."""
    model.eval()
    device = next(model.parameters()).device
    correct, loss_sum, n, count = 0, 0.0, len(data.labels), 0
    for start in range(0, n, batch_size):
        x, y = data.batch(torch.arange(start, min(start + batch_size, n)))
        logits = model(x.to(device))
        y = y.to(device)
        loss_sum += float(task_loss(logits, y, reduction="sum"))
        hits, predictions = count_correct(logits, y)
        correct, count = correct + hits, count + predictions
    return correct / count, loss_sum / count
