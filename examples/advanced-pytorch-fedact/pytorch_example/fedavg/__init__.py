"""The app on Flower's FedAvg, before the switch."""
