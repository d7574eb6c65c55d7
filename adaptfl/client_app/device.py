"""Pick the torch device per node: CUDA when present, CPU otherwise, or what the node says.

The choice comes from the SuperNode's node config (`--node-config 'device="cuda:1"'`) when it
sets one, else from the run config's `device`; the same code runs on a GPU node and a CPU node.
"""

from __future__ import annotations

import resource
import sys

import torch


def select_device(choice: str) -> torch.device:
    """`auto` -> cuda if available else cpu; `cpu`, `cuda`, `cuda:N` as given (checked)."""
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if choice == "cpu":
        return torch.device("cpu")
    if choice == "cuda" or choice.startswith("cuda:"):
        if not torch.cuda.is_available():
            raise ValueError(f"device={choice!r} requested but this node has no CUDA device")
        index = choice.removeprefix("cuda").removeprefix(":")
        if index and (not index.isdigit() or int(index) >= torch.cuda.device_count()):
            raise ValueError(f"invalid device={choice!r}: this node has "
                             f"{torch.cuda.device_count()} CUDA device(s)")
        return torch.device(choice)
    raise ValueError(f"invalid device={choice!r}: choose auto, cpu, cuda or cuda:N")


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_mb(device: torch.device) -> float:
    """This round's peak on CUDA (`max_memory_allocated`); on CPU the process's peak resident
    set (`ru_maxrss`: since the process started, so in the in-process engine the server's too)."""
    if device.type == "cuda":
        return round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return round(peak / 2**20 if sys.platform == "darwin" else peak / 2**10, 1)
