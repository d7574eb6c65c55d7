"""Pick the torch device per node: CUDA when present, CPU otherwise, or what the node says."""

from __future__ import annotations

import torch


def select_device(choice: str) -> torch.device:
    """`auto` -> cuda if available else cpu; `cpu`, `cuda`, `cuda:N` as given."""
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if choice == "cpu":
        return torch.device("cpu")
    if choice.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"device={choice!r} requested but this node has no CUDA device")
        return torch.device(choice)
    raise ValueError(f"invalid device={choice!r}: choose auto, cpu, cuda or cuda:N")
