"""The app before the switch: Flower's FedAvg and a plain SGD training loop."""
