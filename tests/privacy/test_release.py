"""What a dp run releases (issue 31 §3, §5; privacy/release.py): only the whitelist in the shared
outputs, no participant named anywhere shared, the rest in a 0600 confidential file; the sample
drawn from OS entropy, not the run's seed (which stays the sampler without dp)."""

from __future__ import annotations

import csv
import json
import logging
import re
import stat

import pytest

from adaptfl.algorithms.config import RunConfig
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.privacy.release import CONFIDENTIAL_FILE, RELEASED
from adaptfl.server_app.loop import run_federated
from adaptfl.strategies.base import AdaptiveStrategy
from tests.conftest import needs_fashion_mnist
from tests.privacy.test_privacy import FAMILIES
from tests.strategies.test_hostile_replies import GRID, MODEL, SPEC, _honest, _message
from tests.strategies.test_hostile_replies import _strategy as _family
from tests.support.run_outputs import die_before_checkpoint, metric_rows

TINY = dict(num_server_rounds=1, local_steps=1, batch_size=16, model="mlp", weighting="uniform",
            fraction_train=1.0, dp_accounting="no-amplification", dp_state_clip_norm=1e-3,
            dp_accept_epsilon=1e3,  # a tiny federation's ε: not what these tests check
            accept_small_rounds=True)  # two nodes a round
NAMES_A_NODE = re.compile(r"\b(node|nodes|client|partition)s? \[?\d")  # "node 3", "nodes [1, 2]"


def _config(tmp_path, tiny_data, algorithm: str, dp: str, **extra) -> RunConfig:  # noqa: ANN001
    more = {"light": True} if algorithm.endswith("+light") else {}
    if algorithm == "hafedho":  # dp needs |D| declared (a bound above the partitions' sizes)
        more["total_examples"] = 1e6
    return RunConfig.of(algorithm=algorithm.removesuffix("+light"), dp=dp,
                        results_dir=str(tmp_path), data_dir=tiny_data["fashion-mnist"],
                        **{**TINY, **more, **extra})


def _confidential(run_dir) -> list[dict]:  # noqa: ANN001
    return [json.loads(line) for line in (run_dir / CONFIDENTIAL_FILE).read_text().splitlines()]


@needs_fashion_mnist
@pytest.mark.parametrize("dp", ["central", "client"])
@pytest.mark.parametrize("algorithm", FAMILIES)
@pytest.mark.slow
def test_a_dp_run_releases_only_the_whitelist_and_keeps_the_rest_confidential(
        tmp_path, tiny_data, caplog, algorithm: str, dp: str) -> None:
    cfg = _config(tmp_path, tiny_data, algorithm, dp, run_name="r")
    with caplog.at_level(logging.INFO):
        out = run_federated(InProcessGrid(2, cfg.to_flower()), cfg)
    rows = metric_rows(out, initial=True)
    assert [r["round"] for r in rows] == [0, 1] and "dp-epsilon" in rows[-1]
    assert _confidential(out)[-1]["replies-accepted"] == 2, _confidential(out)[-1].get("rejected")
    for row in rows:
        assert set(row) <= RELEASED, sorted(set(row) - RELEASED)
        assert all(isinstance(v, int | float) for v in row.values())  # no ids, lists, reasons
    with (out / "metrics.csv").open() as fh:
        assert set(next(csv.reader(fh))) <= RELEASED
    # the log a console or a run log shares: no node, client or partition named at INFO and up
    shared = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert not [m for m in shared if NAMES_A_NODE.search(m)]
    assert not [m for m in shared if "train-loss" in m or ": loss " in m]
    # the server's: the whole rows, 0600, with who took part and the clients' values
    path = out / CONFIDENTIAL_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    whole = _confidential(out)
    assert [r["round"] for r in whole] == [0, 1]
    assert sorted(whole[-1]["latency"]) == ["1", "2"]
    # dp='client': the nodes do not send it (privacy/reply_metrics.py); central: the server's own
    assert ("train-loss" in whole[-1]) == (dp != "client")
    assert {c["node-id"] for c in whole[-1]["clients"].values()} == {1, 2}
    assert all(whole[-1][k] == v for k, v in rows[-1].items())  # the released part, as released


def test_flowers_strategy_start_gets_only_the_whitelist_under_dp(caplog) -> None:
    """aggregate_train's MetricRecord is what Flower's Strategy.start logs and keeps; a dropped
    reply names its node and reason, a client's non-finite metric its value, at DEBUG only (the
    round's report keeps who and why)."""
    from flwr.app import ArrayRecord, ConfigRecord

    strategy = _family("fedact", dp="central", weighting="uniform")
    sent = {m.metadata.dst_node_id: m for m in strategy.configure_train(
        1, ArrayRecord(strategy.state.model), ConfigRecord(), GRID)}
    honest = {n: _honest(strategy, n) for n in sent}
    honest[1]["metrics"]["num-examples"] = -1  # dropped, with its reason
    honest[2]["metrics"]["my-loss"] = float("nan")  # a client's own metric, left out (logged)
    replies = [_message(sent[n], r) for n, r in honest.items()]
    with caplog.at_level(logging.DEBUG):
        _, metrics = strategy.aggregate_train(1, replies)
    assert set(metrics) <= RELEASED and "dp-epsilon" in metrics
    assert "direction-consistency" in strategy.report.metrics and strategy.report.rejected
    shared = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert not [m for m in shared if "dropped" in m or "my-loss" in m], shared
    assert any("my-loss" in r.getMessage() for r in caplog.records)  # at DEBUG, for the operator


def _samples(strategy: AdaptiveStrategy, rounds: int) -> list[list[int]]:
    grid = InProcessGrid(10, {})
    return [strategy.sample_nodes(grid) for _ in range(rounds)]


def _strategy(**kw) -> AdaptiveStrategy:
    strategy = AdaptiveStrategy(RunConfig.of(fraction_train=0.3, seed=42, **kw))
    strategy.initialize(MODEL, SPEC)
    return strategy


def test_under_dp_the_sample_does_not_follow_the_seed_and_without_dp_it_does() -> None:
    """10 nodes choose 3 over 6 rounds: two runs of one seed sample alike with probability
    120⁻⁶ < 1e-12 under dp; without dp they must, round for round."""
    dp = dict(dp="central", weighting="uniform")
    a, b = _samples(_strategy(**dp), 6), _samples(_strategy(**dp), 6)
    assert all(len(s) == 3 and len(set(s)) == 3 and set(s) <= set(range(1, 11)) for s in a + b)
    assert a != b
    assert _samples(_strategy(), 6) == _samples(_strategy(), 6)
    assert len({tuple(s) for s in _samples(_strategy(), 6)}) > 1  # the seeded RNG moves on


@needs_fashion_mnist
def test_a_dp_run_resumes_from_its_confidential_rows(tmp_path, tiny_data, monkeypatch) -> None:
    """Killed before round 2's checkpoint: the resume restores both files to round 1's rows
    (the whole ones from the confidential file, not the released ones) and trains round 2."""
    cfg = _config(tmp_path, tiny_data, "fedavg", "central", run_name="k", num_server_rounds=2)
    die_before_checkpoint(monkeypatch, 2)
    with pytest.raises(KeyboardInterrupt):
        run_federated(InProcessGrid(2, cfg.to_flower()), cfg)
    out = tmp_path / "k"
    first = _confidential(out)[:2]
    monkeypatch.undo()  # the real checkpoint again
    resumed = cfg.replace(resume=True)
    run_federated(InProcessGrid(2, resumed.to_flower()), resumed)
    whole = _confidential(out)
    assert [r["round"] for r in whole] == [0, 1, 2] and whole[:2] == first
    assert "latency" in whole[1] and "latency" in whole[2]
    rows = metric_rows(out, initial=True)
    assert [r["round"] for r in rows] == [0, 1, 2] and all(set(r) <= RELEASED for r in rows)
    assert stat.S_IMODE((out / CONFIDENTIAL_FILE).stat().st_mode) == 0o600


MODEL_DEPENDENT = {"test-accuracy", "test-loss", "eval-seconds"}  # of the noised model, fresh noise
PUBLIC_FILES = {"metrics.jsonl", "metrics.csv", "config.json", "model.pt", "plot.png", "diagnostics.png",
                "data-summary.json"}  # under dp the task alone


@needs_fashion_mnist
@pytest.mark.slow
def test_the_release_does_not_change_with_which_node_was_slow_or_failed(tmp_path, tiny_data,
                                                                         monkeypatch) -> None:
    """dp='client', 4 nodes, min-replies=3, 2 rounds: node 4 fails every round, or node 2
    does, or none fails and node 1 is slow. Every released value but the noised model's
    evaluation is the same in the three runs; the files that name participation (the
    confidential rows, state.pt's ownership map) are 0600 and the rest is public."""
    import time

    from adaptfl.client_app.app import train_or_refuse

    def slow(msg, context):  # noqa: ANN001, ANN202
        if context.node_id == 1:
            time.sleep(0.3)
        return train_or_refuse(msg, context)

    released_rows = {}
    for name, failing in (("node-4-fails", 4), ("node-2-fails", 2), ("node-1-slow", None)):
        cfg = _config(tmp_path, tiny_data, "fedavg", "client", run_name=name, num_server_rounds=2,
                      min_replies=3, dp_ledger=str(tmp_path / f"{name}.jsonl"))  # each its own total
        grid = InProcessGrid(4, cfg.to_flower(), handler=slow)
        if failing is not None:
            grid.contexts[failing].node_config["dp-min-noise-multiplier"] = 100.0  # refuses z = 1
        out = run_federated(grid, cfg)
        accepted = [r["replies-accepted"] for r in _confidential(out) if r["round"] >= 1]
        assert accepted == ([3, 3] if failing else [4, 4])  # the runs did differ
        released_rows[name] = [{k: v for k, v in r.items() if k not in MODEL_DEPENDENT}
                               for r in metric_rows(out, initial=True)]
        for path in out.iterdir():
            mode = stat.S_IMODE(path.stat().st_mode)
            assert path.name in PUBLIC_FILES or mode == 0o600, (path.name, oct(mode))
        assert stat.S_IMODE((out / "state.pt").stat().st_mode) == 0o600
    first, *others = released_rows.values()
    assert all(rows == first for rows in others), released_rows
