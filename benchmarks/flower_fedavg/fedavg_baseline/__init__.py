"""Flower's FedAvg (`strategy.start`) with adaptfl's task, model, partitions and evaluation."""
