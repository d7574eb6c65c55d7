"""FedDyn (Acar et al. 2021): a dynamic regulariser on the clients and the server's h
(algorithms/components/feddyn.py)."""

from __future__ import annotations

from adaptfl.strategies.base import AdaptiveStrategy


class FedDyn(AdaptiveStrategy):
    """`FedDyn(fraction_train=..., <hyperparameters>)` with the paper's defaults (docs/algorithms.md)."""

    algorithm = "feddyn"
