"""The data summary before round 1 (issue 33): sizes and label skew per partition, as the
clients cut them; withheld under dp."""

from __future__ import annotations

import json

import pytest
import torch

from adaptfl.algorithms.config import RunConfig
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.server_app.data_summary import summarize, summary_line
from adaptfl.server_app.loop import build_run, run_federated
from adaptfl.workloads import partition_indices


def _summary(tiny_data, **kw):  # noqa: ANN001, ANN202
    cfg = RunConfig.of(model="mlp", data_dir=tiny_data["fashion-mnist"], **kw)
    _, _, task = build_run(cfg)
    return cfg, task, summarize(task, cfg, 4)


def test_partition_sizes_and_label_counts_are_the_clients_own(tiny_data) -> None:
    cfg, task, summary = _summary(tiny_data, partitioning="pathological", classes_per_client=2)
    labels = task.train.labels
    for pid in range(4):
        idx = partition_indices(labels, 4, pid, "pathological", cfg.data.dirichlet_alpha,
                                cfg.federation.seed, 2)
        assert summary["sizes"][pid] == len(idx)
        assert summary["label-counts"][pid] == torch.bincount(labels[idx], minlength=10).tolist()
        assert sum(c > 0 for c in summary["label-counts"][pid]) <= 2
    _, _, iid = _summary(tiny_data, partitioning="iid")
    assert iid["skew"] < 0.2 < summary["skew"]  # the partitioning is what the skew measures
    assert "label skew" in summary_line(summary) and summary["train-rows"] == len(task.train)


def test_under_dp_only_the_task_is_summarized(tiny_data) -> None:
    _, _, summary = _summary(tiny_data, dp="central", weighting="uniform")
    assert "sizes" not in summary and "label-counts" not in summary
    assert "withheld under dp" in summary_line(summary)


@pytest.mark.parametrize("partitioning", ["dirichlet"])
@pytest.mark.slow
def test_a_run_writes_the_summary_and_its_plot(tiny_data, tmp_path, partitioning: str) -> None:
    cfg = RunConfig.of(model="mlp", data_dir=tiny_data["fashion-mnist"], num_server_rounds=1,
                       local_steps=1, partitioning=partitioning, results_dir=str(tmp_path), run_name="r")
    out = run_federated(InProcessGrid(3, cfg.to_flower()), cfg)
    written = json.loads((out / "data-summary.json").read_text())
    assert written["partitions"] == 3 and len(written["sizes"]) == 3
    assert (out / "partitions.png").stat().st_size > 0
