"""Secure aggregation (SecAgg+) on Flower's Message API (docs/privacy.md)."""
