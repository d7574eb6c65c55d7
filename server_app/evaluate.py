"""Central evaluation of the global model on the task's test split."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from workloads import ImageData


@torch.no_grad()
def evaluate(model: torch.nn.Module, data: ImageData, batch_size: int = 1000) -> tuple[float, float]:
    """(accuracy, mean cross-entropy loss) over the whole split."""
    model.eval()
    device = next(model.parameters()).device
    correct, loss_sum, n = 0, 0.0, len(data.labels)
    for start in range(0, n, batch_size):
        x, y = data.batch(torch.arange(start, min(start + batch_size, n)))
        logits = model(x.to(device))
        y = y.to(device)
        loss_sum += float(F.cross_entropy(logits, y, reduction="sum"))
        correct += int((logits.argmax(1) == y).sum())
    return correct / n, loss_sum / n
