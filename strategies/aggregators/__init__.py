"""How replies are combined into one value per coordinate: the mean Δ and every extra state a
strategy averages (v̄, Θ, control variates, ∇f_i(x)). One file per aggregator; `aggregator=`
selects it for every algorithm."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from adaptfl.algorithms.params import Component

Tensors = dict[str, torch.Tensor]


class Aggregator(Component):
    """Base: `combine(items, weights)` -> one dict of tensors, items in a fixed order."""

    def combine(self, items: Sequence[Mapping[str, torch.Tensor]], weights: Sequence[float]) -> Tensors:
        raise NotImplementedError
