"""SGD: d = g. Weight decay is decoupled in the step: x = (1 - lr·wd)·x - lr·g, which is
`torch.optim.SGD(weight_decay=wd)`'s update rewritten (equal up to rounding)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from adaptfl.core.params import component
from adaptfl.local_update.rules import Direction, Preconditioner, Step


@component("preconditioner", "sgd")
@dataclass(frozen=True)
class SGD(Preconditioner):
    """Plain SGD (FedAvg, FedProx, SCAFFOLD, HaFedHo, the server-optimizer family)."""

    default_lr = 0.1  # FedACT's Table 6 for SGD
    default_weight_decay = 1e-3

    def direction(self, g: torch.Tensor, st: dict[str, Any], step: Step) -> Direction:
        # A copy: the chain scales u in place and still needs g for the trust scores.
        return Direction(g.clone())
