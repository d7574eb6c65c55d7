"""Per-node device choice: CUDA where a node has it, CPU otherwise, the node config first."""

from __future__ import annotations

import pytest
import torch

from adaptfl.algorithms.config import RunConfig
from adaptfl.client_app import device as device_module
from adaptfl.client_app.device import select_device
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.server_app.loop import run_federated
from tests.conftest import needs_fashion_mnist
from tests.support.run_outputs import metric_rows


def _pretend_gpus(monkeypatch, count: int) -> None:
    monkeypatch.setattr(device_module.torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(device_module.torch.cuda, "device_count", lambda: count)


def test_auto_picks_cuda_only_where_the_node_has_it(monkeypatch) -> None:
    _pretend_gpus(monkeypatch, 0)
    assert select_device("auto") == torch.device("cpu")
    _pretend_gpus(monkeypatch, 2)
    assert select_device("auto") == torch.device("cuda")
    assert select_device("cuda:1") == torch.device("cuda:1")
    assert select_device("cpu") == torch.device("cpu")


@pytest.mark.parametrize("choice,gpus,message", [
    ("cuda", 0, "no CUDA device"),
    ("cuda:0", 0, "no CUDA device"),
    ("cuda:2", 2, "has 2 CUDA device"),
    ("cuda:x", 1, "invalid device='cuda:x'"),
    ("tpu", 1, "invalid device='tpu'"),
    ("cudax", 1, "invalid device='cudax'"),
])
def test_devices_a_node_cannot_serve_are_refused_by_name(monkeypatch, choice, gpus, message) -> None:
    _pretend_gpus(monkeypatch, gpus)
    with pytest.raises(ValueError, match=message):
        select_device(choice)


@needs_fashion_mnist
@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a node without CUDA")
@pytest.mark.slow
def test_a_node_config_device_overrides_the_run_config(tmp_path) -> None:
    """Run config asks for CUDA on a CPU-only machine: the node that says `device="cpu"` trains,
    the node that does not override fails with the reason, and the round still aggregates."""
    cfg = RunConfig.of(figures=False,
                       results_dir=str(tmp_path), run_name="d", model="mlp", num_server_rounds=1,
                    local_steps=2, batch_size=16, device="cuda", accept_small_rounds=True)
    grid = InProcessGrid(2, cfg.to_flower())
    grid.contexts[1].node_config["device"] = "cpu"
    out = run_federated(grid, cfg)
    (row,) = metric_rows(out)
    assert row["replies-accepted"] == 1 and list(row["rejected"]) == ["2"]
    assert "device='cuda' requested but this node has no CUDA device" in row["rejected"]["2"]
