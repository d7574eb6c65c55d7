"""FedAvg (McMahan et al. 2017): x <- x + mean Δ_i over local SGD.

The same replies give the same model as Flower's own `FedAvg`; adaptfl's version adds reply
validation, seeded sampling, checkpointable state and the composable server optimizer."""

from __future__ import annotations

from adaptfl.strategies.base import AdaptiveStrategy


class FedAvg(AdaptiveStrategy):
    """`FedAvg(fraction_train=..., <hyperparameters>)` with the paper's defaults (docs/algorithms.md)."""

    algorithm = "fedavg"
