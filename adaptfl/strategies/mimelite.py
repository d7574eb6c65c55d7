"""MimeLite (Karimireddy et al. 2021): the server's momentum applied on the clients, full-batch
gradients at x^r uploaded to update it (algorithms/components/mimelite.py)."""

from __future__ import annotations

from adaptfl.strategies.base import AdaptiveStrategy


class MimeLite(AdaptiveStrategy):
    """`MimeLite(fraction_train=..., <hyperparameters>)` with the paper's defaults (docs/algorithms.md)."""

    algorithm = "mimelite"
