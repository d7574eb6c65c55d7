"""Flower strategies, one per file; `AdaptiveStrategy(config)` serves every other algorithm of
the catalog. Server optimizers and aggregators are below them, in adaptfl/server_rules/."""

from adaptfl.strategies.base import AdaptiveStrategy
from adaptfl.strategies.diloco import DiLoCo
from adaptfl.strategies.diloco_act import DiLoCoACT
from adaptfl.strategies.fedact import FedACT
from adaptfl.strategies.fedadamom import FedAdamom
from adaptfl.strategies.fedadamw import FedAdamW
from adaptfl.strategies.fedavg import FedAvg
from adaptfl.strategies.feddyn import FedDyn
from adaptfl.strategies.fedmixp import FedMIXP
from adaptfl.strategies.fedpac import FedPAC
from adaptfl.strategies.fedprox import FedProx
from adaptfl.strategies.hafedho import HaFedHo
from adaptfl.strategies.mimelite import MimeLite
from adaptfl.strategies.moon import Moon
from adaptfl.strategies.muloco import MuLoCo
from adaptfl.strategies.scaffold import Scaffold
from adaptfl.strategies.state import RoundReport

__all__ = [
    "AdaptiveStrategy", "DiLoCo", "DiLoCoACT", "FedACT", "FedAdamW", "FedAdamom", "FedAvg",
    "FedDyn", "FedMIXP", "FedPAC", "FedProx", "HaFedHo", "MimeLite", "Moon", "MuLoCo",
    "RoundReport", "Scaffold",
]
