"""The training / evaluation loss and accuracy every task shares.

Image classifiers give logits [B, C] for labels [B]; language models give [B, T, V] for next
tokens [B, T]. Flattening all leading axes makes one cross-entropy serve both, so the client
loop and the server's evaluation need no per-task branch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def task_loss(logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy over every prediction: one per image, or one per token."""
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"logits {tuple(logits.shape)} do not match targets {tuple(targets.shape)}: "
                         "expected logits = targets' shape + [classes]")
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction=reduction)


def count_correct(logits: torch.Tensor, targets: torch.Tensor) -> tuple[int, int]:
    """(correct predictions, predictions): top-1 accuracy for images, token accuracy for text."""
    return int((logits.argmax(-1) == targets).sum()), targets.numel()
