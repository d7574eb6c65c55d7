"""Server strategies on Flower's message-API `Strategy`, one per file."""

from adaptfl.strategies.base import AdaptiveStrategy, ModelSpec
from adaptfl.strategies.fedact import FedACTStrategy
from adaptfl.strategies.fedavg import FedAvgStrategy
from adaptfl.strategies.feddyn import FedDynStrategy
from adaptfl.strategies.fedmixp import FedMIXPStrategy
from adaptfl.strategies.fedpac import FedPACStrategy
from adaptfl.strategies.hafedho import HaFedHoStrategy
from adaptfl.strategies.mimelite import MimeLiteStrategy
from adaptfl.strategies.scaffold import ScaffoldStrategy

STRATEGIES: dict[str, type[AdaptiveStrategy]] = {
    "fedavg": FedAvgStrategy,
    "fedact": FedACTStrategy,
    "hafedho": HaFedHoStrategy,
    "scaffold": ScaffoldStrategy,
    "feddyn": FedDynStrategy,
    "mimelite": MimeLiteStrategy,
    "fedpac": FedPACStrategy,
    "fedmixp": FedMIXPStrategy,
}

__all__ = ["STRATEGIES", "AdaptiveStrategy", "FedACTStrategy", "FedAvgStrategy", "FedDynStrategy",
           "FedMIXPStrategy", "FedPACStrategy",
           "HaFedHoStrategy", "MimeLiteStrategy", "ModelSpec", "ScaffoldStrategy"]
