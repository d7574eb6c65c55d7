"""num-threads=0 takes the CPUs a client has (client_app/threads.py): Ray's assignment in
Flower's simulation, CPUs // num-nodes in the in-process engine, torch's default elsewhere."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from adaptfl.client_app import threads
from adaptfl.client_app.threads import client_threads, engine_threads


def fake_ray(assigned: dict[str, float]) -> SimpleNamespace:
    context = SimpleNamespace(get_assigned_resources=lambda: assigned)
    return SimpleNamespace(is_initialized=lambda: True, get_runtime_context=lambda: context)


def test_a_set_value_wins_everywhere(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", fake_ray({"CPU": 4.0}))
    assert client_threads(3) == 3 and engine_threads(3, num_nodes=10, cpus=2) == 3


@pytest.mark.parametrize(("cpus", "expected"), [(1.0, 1), (2.0, 2), (2.5, 2), (0.25, 1)])
def test_in_a_ray_actor_the_assigned_cpus(monkeypatch, cpus: float, expected: int) -> None:
    monkeypatch.setitem(sys.modules, "ray", fake_ray({"CPU": cpus}))
    assert client_threads(0) == expected


def test_outside_ray_the_process_keeps_its_setting(monkeypatch) -> None:
    monkeypatch.delitem(sys.modules, "ray", raising=False)
    assert client_threads(0) is None
    monkeypatch.setitem(sys.modules, "ray", fake_ray({}))  # a Ray process with no CPU assigned
    assert client_threads(0) is None


@pytest.mark.parametrize(("nodes", "cpus", "expected"), [(10, 2, 1), (2, 2, 1), (1, 2, 2), (2, 16, 8),
                                                         (3, 16, 5)])
def test_the_engine_shares_its_cpus_between_its_nodes(nodes: int, cpus: int, expected: int) -> None:
    assert engine_threads(0, num_nodes=nodes, cpus=cpus) == expected


def test_the_engine_cli_sets_the_shared_count_before_the_run(monkeypatch, tmp_path: Path) -> None:
    from adaptfl.engine import __main__ as cli
    from adaptfl.engine import inprocess

    seen: list[int] = []

    def fake_run(cfg, num_nodes, on_round=None) -> Path:  # noqa: ANN001 - run_inprocess's shape
        seen.append(torch.get_num_threads())
        (tmp_path / "metrics.jsonl").write_text('{"round": 0, "test-accuracy": 0.1, "test-loss": 2.3}\n')
        return tmp_path

    monkeypatch.setattr(inprocess, "run_inprocess", fake_run)
    monkeypatch.setattr(threads, "process_cpus", lambda: 4)
    before = torch.get_num_threads()
    try:
        cli.main(["--quiet", "--num-nodes", "2", "num-server-rounds=1"])
        cli.main(["--quiet", "--num-nodes", "2", "num-server-rounds=1", "num-threads=3"])
    finally:
        torch.set_num_threads(before)
    assert seen == [2, 3]  # 4 CPUs // 2 nodes; then the run config's own value
