"""Server strategies on Flower's message-API `Strategy`, one per file."""

from strategies.base import AdaptiveStrategy, ModelSpec
from strategies.fedact import FedACTStrategy
from strategies.fedavg import FedAvgStrategy

STRATEGIES: dict[str, type[AdaptiveStrategy]] = {
    "fedavg": FedAvgStrategy,
    "fedact": FedACTStrategy,
}

__all__ = ["STRATEGIES", "AdaptiveStrategy", "FedACTStrategy", "FedAvgStrategy", "ModelSpec"]
