"""MOON (Li, He & Song 2021): local SGD plus a model-contrastive loss against the global and the
previous local model (algorithms/components/moon.py)."""

from __future__ import annotations

from adaptfl.strategies.base import AdaptiveStrategy


class Moon(AdaptiveStrategy):
    """`Moon(fraction_train=..., <hyperparameters>)` with the paper's defaults (docs/algorithms.md)."""

    algorithm = "moon"
