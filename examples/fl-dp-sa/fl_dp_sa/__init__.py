"""Flower's fl-dp-sa example (client-side clipping, DP noise, SecAgg+), on adaptfl."""
