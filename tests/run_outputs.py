"""Reading a finished run's results directory, shared by the end-to-end tests."""

from __future__ import annotations

import json
from pathlib import Path

import torch


def metric_rows(run_dir: Path, initial: bool = False) -> list[dict]:
    """The per-round rows of `metrics.jsonl`, in round order; the initial model's round 0 only
    with `initial`."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return rows if initial else [r for r in rows if r["round"] >= 1]


def final_model(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "model.pt", weights_only=True)


def assert_same_model(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    """Bit-for-bit equality of two state dicts, naming the first tensor that differs."""
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
