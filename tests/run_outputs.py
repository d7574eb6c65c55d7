"""Reading a finished run's results directory, shared by the end-to-end tests."""

from __future__ import annotations

import json
from pathlib import Path

import torch


def metric_rows(run_dir: Path) -> list[dict]:
    """The per-round rows of `metrics.jsonl`, in round order."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def final_model(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "model.pt", weights_only=True)


def assert_same_model(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    """Bit-for-bit equality of two state dicts, naming the first tensor that differs."""
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
