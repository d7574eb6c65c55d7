"""Server strategies on Flower's message-API `Strategy`, one per file."""

from strategies.base import AdaptiveStrategy, ModelSpec
from strategies.fedact import FedACTStrategy
from strategies.fedavg import FedAvgStrategy
from strategies.feddyn import FedDynStrategy
from strategies.fedmixp import FedMIXPStrategy
from strategies.fedpac import FedPACStrategy
from strategies.hafedho import HaFedHoStrategy
from strategies.mimelite import MimeLiteStrategy
from strategies.scaffold import ScaffoldStrategy

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
