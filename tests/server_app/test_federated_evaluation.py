"""Federated evaluation through adaptfl's round loop and ClientApp, on the in-process engine
(`python -m adaptfl.engine fraction-evaluate=...`): each sampled client scores the global model
and its locally adapted one on its own held-out rows; the row's aggregate (trimmed: one cut at
each end) is recomputed by hand from the per-client values; evaluation changes no training; under
dp nothing of it is released."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from adaptfl.algorithms.config import RunConfig
from adaptfl.engine.inprocess import InProcessGrid, run_inprocess
from adaptfl.privacy.release import RELEASED
from adaptfl.server_app.columns import COLUMNS
from adaptfl.server_app.loop import run_federated
from adaptfl.workloads import load_task, partition_indices
from adaptfl.workloads.held_out import held_out_rows
from tests.conftest import needs_fashion_mnist
from tests.support.run_outputs import assert_same_model, confidential_rows, final_model, metric_rows

TINY = dict(algorithm="fedact", model="mlp", num_server_rounds=2, local_steps=3, batch_size=16,
            num_threads=1, seed=3, accept_small_rounds=True)  # some sample two a round
FED_COLUMNS = sorted(k for k in COLUMNS if k.startswith("fed-eval-") and k != "fed-eval-rejected")


def _run(tmp_path, tiny_data, name: str, nodes: int = 4, **extra) -> list[dict]:  # noqa: ANN001
    cfg = RunConfig.of(data_dir=tiny_data["fashion-mnist"],
                       figures=False, results_dir=str(tmp_path), run_name=name,
                       **{**TINY, **extra})
    return metric_rows(run_inprocess(cfg, nodes))


@needs_fashion_mnist
def test_the_rows_aggregate_is_the_clients_values_weighted_by_hand(tmp_path, tiny_data) -> None:
    rows = _run(tmp_path, tiny_data, "fed", fraction_evaluate=0.75)
    for row in rows:
        assert sorted(k for k in row if k.startswith("fed-eval-")) == FED_COLUMNS
        clients = row["fed-eval-clients"]
        assert row["fed-eval-sampled"] == 3 and row["fed-eval-replies"] == len(clients) == 3
        n = np.array([c["num-examples"] for c in clients.values()], dtype=float)
        assert row["fed-eval-trimmed-per-end"] == 1  # of three: the lowest and highest are cut
        for key, column in (("eval-accuracy", "fed-eval-accuracy"), ("eval-loss", "fed-eval-loss"),
                            ("personal-accuracy", "fed-eval-personal-accuracy"),
                            ("personal-loss", "fed-eval-personal-loss")):
            values = np.array([c[key] for c in clients.values()])
            kept = np.argsort(values, kind="stable")[1:-1]
            assert row[column] == pytest.approx(float((values[kept] * n[kept]).sum() / n[kept].sum()),
                                                rel=1e-12)
        for key, column in (("eval-accuracy", "fed-eval-accuracy-p10"),
                            ("personal-accuracy", "fed-eval-personal-accuracy-p10")):
            values = sorted(c[key] for c in clients.values())[1:-1]
            assert row[column] == pytest.approx(float(np.percentile(values, 10)), rel=1e-12)
        # the local steps moved each client's model: its own scores differ from the global model's
        assert all(c["personal-loss"] != c["eval-loss"] for c in clients.values())
    # a client's held-out rows are the same every round (3 of 4 sampled twice: 2 in common at least)
    first, second = (r["fed-eval-clients"] for r in rows)
    both = set(first) & set(second)
    assert len(both) >= 2
    assert all(first[n]["num-examples"] == second[n]["num-examples"] for n in both)


@needs_fashion_mnist
@pytest.mark.parametrize("algorithm", ["fedact", "scaffold"])  # scaffold: durable client state c_i
@pytest.mark.slow
def test_evaluation_changes_no_training_and_is_absent_by_default(tmp_path, tiny_data, algorithm) -> None:
    """The same run with fraction-evaluate=1 and without, half the nodes training a round: the
    same models and central scores (no training sample, client state or RNG is touched), and no
    fed-eval column without."""
    on = _run(tmp_path, tiny_data, "on", fraction_evaluate=1.0, fraction_train=0.5, algorithm=algorithm)
    off = _run(tmp_path, tiny_data, "off", fraction_train=0.5, algorithm=algorithm)
    assert_same_model(final_model(tmp_path / "on"), final_model(tmp_path / "off"))
    assert [r["test-accuracy"] for r in on] == [r["test-accuracy"] for r in off]
    assert not [k for r in off for k in r if k.startswith("fed-eval")]
    assert all(r["fed-eval-replies"] == 4 for r in on)


@needs_fashion_mnist
@pytest.mark.slow
def test_evaluate_local_steps_sets_the_personalised_models_steps(tmp_path, tiny_data) -> None:
    """The global model's scores do not depend on it; the personalised ones do (1 step, not K=3)."""
    k = _run(tmp_path, tiny_data, "k", nodes=2, fraction_evaluate=1.0, num_server_rounds=1)[0]
    one = _run(tmp_path, tiny_data, "one", nodes=2, fraction_evaluate=1.0, num_server_rounds=1,
               evaluate_local_steps=1)[0]
    assert k["fed-eval-loss"] == one["fed-eval-loss"]
    assert k["fed-eval-personal-loss"] != one["fed-eval-personal-loss"]


@needs_fashion_mnist
def test_under_dp_nothing_of_it_is_released(tmp_path, tiny_data, caplog) -> None:
    cfg = RunConfig.of(data_dir=tiny_data["fashion-mnist"],
                       figures=False, results_dir=str(tmp_path), run_name="dp",
                       algorithm="fedavg", model="mlp", num_server_rounds=1, local_steps=1, batch_size=16,
                       weighting="uniform", dp="central", dp_accounting="no-amplification",
                       dp_accept_epsilon=1e3, fraction_evaluate=1.0, accept_small_rounds=True)
    with caplog.at_level(logging.INFO):
        out = run_federated(InProcessGrid(2, cfg.to_flower()), cfg)
    shared = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert any("the fed-eval columns are not released" in m for m in shared)
    assert not [m for m in shared if "federated evaluation" in m or "held-out" in m]  # DEBUG only
    assert not [k for k in RELEASED if k.startswith("fed-eval")]
    assert not [k for r in metric_rows(out) for k in r if k.startswith("fed-eval")]
    assert "fed-eval-" not in (out / "metrics.csv").read_text()
    whole = confidential_rows(out)[-1]
    assert whole["fed-eval-replies"] == 2 and sorted(whole["fed-eval-clients"]) == ["0", "1"]  # partitions


@needs_fashion_mnist
def test_a_clients_held_out_rows_follow_its_partitions_labels(tiny_data) -> None:
    """Of each label its partition holds, its share of that label's test rows (at least one),
    drawn the same way every time; another client draws its own."""
    task = load_task("fashion-mnist", tiny_data["fashion-mnist"], "mlp", RunConfig.of().llm)
    train, test = task.train.labels, task.test.labels
    rows = torch.as_tensor(partition_indices(train, 4, 1, "dirichlet", 0.3, 3))
    held = held_out_rows(train, rows, test, seed=3, client_id=1)
    assert torch.equal(held, held_out_rows(train, rows, test, seed=3, client_id=1))
    assert not torch.equal(held, held_out_rows(train, rows, test, seed=3, client_id=2))
    mine, total, pool = (torch.bincount(t, minlength=10) for t in (train[rows], train, test))
    for label in range(10):
        share = int(mine[label]) * int(pool[label]) / int(total[label])
        want = 0 if mine[label] == 0 else max(1, round(share))
        assert int((test[held] == label).sum()) == min(want, int(pool[label])), label


def test_held_out_rows_by_hand() -> None:
    """Train labels 0,0,0,0,1,1 (client holds rows 0, 1, 4: two of four 0s, one of two 1s);
    test labels 0,0,1,1,2: half the 0s (1 row), half the 1s (1 row), no 2."""
    train = torch.tensor([0, 0, 0, 0, 1, 1])
    test = torch.tensor([0, 0, 1, 1, 2])
    held = held_out_rows(train, torch.tensor([0, 1, 4]), test, seed=0, client_id=0)
    assert len(held) == 2 and test[held].tolist() == [0, 1]
    # a partition whose labels the test split lacks: a uniform draw at its share (3 of 6 -> 2 of 4)
    lone = held_out_rows(torch.tensor([5, 5, 5, 0, 0, 0]), torch.tensor([0, 1, 2]),
                         torch.tensor([1, 2, 3, 4]), seed=0, client_id=0)
    assert len(lone) == 2
