"""Flower's advanced-pytorch example, on adaptfl's FedACT (the FedAvg version: `fedavg/`)."""
