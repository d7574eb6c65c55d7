"""Flower strategies, one per file; `AdaptiveStrategy(config)` serves every other algorithm of
the catalog. Server optimizers are in server_opt/, aggregators in aggregators/.

Imported lazily: the component registry imports server_opt/ and aggregators/ while the run
config is being built, before the strategies (which need the run config) can be.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "AdaptiveStrategy": "base", "RoundReport": "state", "DiLoCo": "diloco", "DiLoCoACT": "diloco_act",
    "MuLoCo": "muloco", "FedACT": "fedact", "FedAdamW": "fedadamw",
    "FedAdamom": "fedadamom", "FedAvg": "fedavg", "FedDyn": "feddyn", "FedMIXP": "fedmixp",
    "FedPAC": "fedpac", "FedProx": "fedprox", "HaFedHo": "hafedho", "MimeLite": "mimelite",
    "Moon": "moon", "Scaffold": "scaffold",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'adaptfl.strategies' has no attribute {name!r}")
    return getattr(importlib.import_module(f"adaptfl.strategies.{_EXPORTS[name]}"), name)
