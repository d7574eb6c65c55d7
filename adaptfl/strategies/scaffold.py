"""SCAFFOLD option II (Karimireddy et al. 2020): control variates c (server) and c_i (durable per
client) correct every local gradient (algorithms/components/scaffold.py)."""

from __future__ import annotations

from adaptfl.strategies.base import AdaptiveStrategy


class Scaffold(AdaptiveStrategy):
    """`Scaffold(fraction_train=..., <hyperparameters>)` with the paper's defaults (docs/algorithms.md)."""

    algorithm = "scaffold"
