"""Shared fixtures: small run configs and hand-built Flower messages."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
needs_fashion_mnist = pytest.mark.skipif(
    not os.path.isdir(FASHION_MNIST_DIR),
    reason=f"Fashion-MNIST not installed at {FASHION_MNIST_DIR} (apt-get install dataset-fashion-mnist)",
)


@pytest.fixture(autouse=True)
def _deterministic_threads():
    torch.set_num_threads(1)  # float results must not depend on the thread count
    yield
