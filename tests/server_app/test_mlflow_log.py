"""`mlflow=true` (issue 33): the run config and each round's numeric metrics in an offline MLflow
file store, `<results dir>/mlruns`, holding what metrics.jsonl holds; off by default; refused in
one line without the tracking extra; an aborted run's MLflow run says FAILED."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.server_app import loop
from adaptfl.server_app.loop import run_federated
from adaptfl.server_app.mlflow_log import STORE, mlflow_client_class, mlflow_name, numeric, param_value
from adaptfl.strategies.state import ServerState
from tests.server_app.test_run_dir import _cfg, _run
from tests.support.run_outputs import metric_rows

try:
    mlflow_client_class()  # MLflow's offline switches first, then `import mlflow`
except ValueError:
    pytest.skip("needs the tracking extra (mlflow-skinny)", allow_module_level=True)



def _the_run(out: Path):  # noqa: ANN202 - MLflow's Run
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(out / STORE).as_uri())
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(runs) == 1
    return client, runs[0]


def _history(client, run, key: str) -> list[tuple[int, float]]:  # noqa: ANN001
    return sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))


def _assert_holds_the_rows(client, run, rows: list[dict]) -> None:  # noqa: ANN001
    """Every metric is a numeric value of metrics.jsonl at its round, and every such value is there."""
    logged = {(key, step, value) for key in run.data.metrics for step, value in _history(client, run, key)}
    assert logged == {(key, r["round"], value) for r in rows for key, value in numeric(r).items()}


@pytest.mark.slow
def test_the_store_holds_the_config_and_the_rows_of_metrics_jsonl(tiny_data, tmp_path) -> None:
    out = _run(_cfg(tiny_data, tmp_path, mlflow=True))
    client, run = _the_run(out)
    assert run.info.run_name == "r" and run.info.status == "FINISHED"
    params = run.data.params
    assert params["algorithm"] == "fedavg" and params["mlflow"] == "true"
    assert params["num-server-rounds"] == "2" and params["run-name"] == "r"
    config = json.loads((out / "config.json").read_text())
    assert params == {mlflow_name(k): param_value(v) for k, v in config.items()}  # all of config.json
    rows = metric_rows(out, initial=True)
    # steps 0..2: round 0 is the initial model's evaluation, as in metrics.jsonl
    assert _history(client, run, "test-accuracy") == [(r["round"], pytest.approx(r["test-accuracy"]))
                                                      for r in rows]
    _assert_holds_the_rows(client, run, rows)
    assert [s for s, _ in _history(client, run, "bytes-up")] == [1, 2]
    assert "clients" not in run.data.metrics and "rejected" not in run.data.metrics  # nested: JSONL only


@pytest.mark.slow
def test_under_dp_the_store_holds_what_metrics_jsonl_holds(tiny_data, tmp_path) -> None:
    cfg = _cfg(tiny_data, tmp_path, mlflow=True, weighting="uniform", dp="central", dp_seed=1,
               dp_testing_reproducible_noise=True, fraction_train=0.5, accept_small_rounds=True,
               dp_accounting="no-amplification", dp_accept_epsilon=1e3)  # tiny federation
    out = run_federated(InProcessGrid(4, cfg.to_flower()), cfg)
    client, run = _the_run(out)
    rows = metric_rows(out, initial=True)
    assert "dp-epsilon" in run.data.metrics
    _assert_holds_the_rows(client, run, rows)


@pytest.mark.slow
def test_off_by_default_writes_no_store(tiny_data, tmp_path) -> None:
    out = _run(_cfg(tiny_data, tmp_path, num_server_rounds=1))
    assert not (out / STORE).exists()


def test_without_the_extra_it_is_refused_in_one_line_before_anything_is_written(
        tiny_data, tmp_path, monkeypatch) -> None:
    from adaptfl.server_app.check_overrides import preflight

    monkeypatch.setitem(sys.modules, "mlflow", None)  # `import mlflow` raises ImportError
    monkeypatch.setitem(sys.modules, "mlflow.tracking", None)
    cfg = _cfg(tiny_data, tmp_path, mlflow=True)
    refusal = r"^mlflow=true needs the mlflow package: pip install 'adaptfl\[tracking\]'$"
    with pytest.raises(ValueError, match=refusal):
        preflight(cfg.to_flower())
    with pytest.raises(ValueError, match=refusal):
        _run(cfg)
    assert not (tmp_path / "r").exists()


@pytest.mark.slow
def test_an_aborted_run_is_failed_and_its_resume_rebuilds_one_finished_run(tiny_data, tmp_path,
                                                                           monkeypatch) -> None:
    cfg = _cfg(tiny_data, tmp_path, mlflow=True)

    def crashed(run_dir: Path, state: ServerState) -> None:
        raise RuntimeError("disk gone while writing the round-1 checkpoint")

    monkeypatch.setattr(loop, "save_checkpoint", crashed)
    with pytest.raises(RuntimeError, match="disk gone"):
        _run(cfg)
    client, run = _the_run(tmp_path / "r")
    assert run.info.status == "FAILED"
    assert [s for s, _ in _history(client, run, "test-accuracy")] == [0, 1]
    monkeypatch.undo()
    out = _run(cfg.replace(resume=True))  # no checkpoint: round 1 again; the store holds one run
    client, run = _the_run(out)
    assert run.info.status == "FINISHED"
    assert _history(client, run, "test-accuracy") == [
        (r["round"], pytest.approx(r["test-accuracy"])) for r in metric_rows(out, initial=True)]


@pytest.mark.slow
def test_turned_on_by_a_resume_the_store_gets_the_earlier_rounds_too(tiny_data, tmp_path) -> None:
    _run(_cfg(tiny_data, tmp_path, num_server_rounds=1))
    out = _run(_cfg(tiny_data, tmp_path, resume=True, mlflow=True))  # and one more round
    client, run = _the_run(out)
    assert [s for s, _ in _history(client, run, "test-accuracy")] == [0, 1, 2]


def test_names_values_and_rows_as_mlflow_takes_them() -> None:
    assert mlflow_name("dp/ε-target:x") == "dp/ε-target_x"  # \w is Unicode: MLflow's own rule
    assert mlflow_name("a" * 300) == "a" * 250
    assert param_value(False) == "false" and param_value(0.5) == "0.5"
    long = param_value("x" * 7000)
    assert len(long) == 6000 and long.endswith("…")
    assert numeric({"round": 3, "test-accuracy": 0.5, "skipped": False, "step-path": "fused",
                    "rejected": {"2": "why"}, "replies-accepted": 2}) == \
        {"test-accuracy": 0.5, "replies-accepted": 2.0}
