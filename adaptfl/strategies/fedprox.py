"""FedProx (Li et al. 2020): local SGD on f_i + (μ/2)·||w - x||² (algorithms/components/prox.py)."""

from __future__ import annotations

from adaptfl.strategies.base import AdaptiveStrategy


class FedProx(AdaptiveStrategy):
    """`FedProx(fraction_train=..., <hyperparameters>)` with the paper's defaults (docs/algorithms.md)."""

    algorithm = "fedprox"
