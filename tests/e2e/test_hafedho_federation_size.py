"""HaFedHo's |D| as seed 003 defines it (Algorithm 1: p_i = |D_i| / |D|, |D| the federation's
examples) under partial participation, and partition ids checked against the partitioning,
where the server knows it (the in-process engine: partition ids 0..N-1 of the run's own
partitioning). Before, |D| was the num-examples of the round's replies summed: with 2 of 4
sampled the cohort's size, and a liar's raw claim went into the broadcast n-total."""

from __future__ import annotations

import shutil
import statistics

import pytest

from adaptfl.core import wire
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.server_app.checkpoint import STATE_FILE
from adaptfl.server_app.loop import build_run, run_federated
from adaptfl.server_app.run_checks import partition_sizes
from adaptfl.strategies.examples import LEDGER
from adaptfl.strategies.state import ServerState
from tests.e2e.test_hostile_e2e import _config, hostile
from tests.support.flower_processes import flwr_run_simulation, stop_local_superlink
from tests.support.run_outputs import metric_rows

TRAIN_ROWS = 600  # tiny_data's Fashion-MNIST training rows, all of them in some partition (iid)


@pytest.mark.slow
def test_with_2_of_4_sampled_the_federation_size_is_every_partitions_examples(tiny_data, tmp_path) -> None:
    cfg = _config(tiny_data, tmp_path, "hafedho", rounds=2, local_steps=2, fraction_train=0.5,
                  num_threads=1)
    out = run_federated(InProcessGrid(4, cfg.to_flower()), cfg)
    rows = metric_rows(out)
    assert [r["replies-accepted"] for r in rows] == [2, 2]
    n_total = float(ServerState.load(out / STATE_FILE).extras[wire.HAFEDHO_N_TOTAL]["n-total"])
    # by hand: |D| = Σ_i |D_i| over the 4 partitions = the 600 rows; the 2 sampled hold 300
    assert n_total == TRAIN_ROWS, n_total
    # so a client of 150 examples that took part weighs its own g_i by p_i = 150 / 600 in round 3


@pytest.mark.slow
def test_a_partition_id_outside_the_partitioning_is_dropped_with_its_reason(tiny_data, tmp_path) -> None:
    def outside(arrays: dict, metrics: dict) -> None:
        metrics[wire.PARTITION_ID] = 2**62

    cfg = _config(tiny_data, tmp_path, "hafedho", rounds=1, local_steps=1, num_threads=1)
    out = run_federated(InProcessGrid(3, cfg.to_flower(), handler=hostile(outside)), cfg)
    (row,) = metric_rows(out)
    assert row["rejected"] == {"1": f"partition-id={2**62} is outside the partitioning's ids 0..2"}
    assert row["replies-accepted"] == 2
    n_total = float(ServerState.load(out / STATE_FILE).extras[wire.HAFEDHO_N_TOTAL]["n-total"])
    assert n_total == TRAIN_ROWS


def _deployment_grid(cfg) -> InProcessGrid:  # noqa: ANN001
    """The in-process nodes, seen by the server as a deployment's: no partitioning it holds
    (each node's data its own), so |D| comes from the clients' claims."""
    grid = InProcessGrid(4, cfg.to_flower())
    grid.static_nodes = False
    return grid


def _by_hand(sizes: list[int]) -> float:
    """|D| from the census before round 1: every partition's examples once, capped at 10× the
    median claim (strategies/census.py, examples.py)."""
    typical = statistics.median(sizes)
    return sum(min(n, 10 * typical) for n in sizes)


@pytest.mark.slow
def test_in_a_deployment_each_clients_examples_count_once_and_survive_a_resume(tiny_data, tmp_path) -> None:
    """2 of 4 sampled a round, Dirichlet α = 0.3 partitions (unequal), the server without the
    partitioning: |D| is the federation's from round 1 (every node answered the census), the
    paper's Σ_i |D_i| where no claim reaches the cap, whichever 2 a round samples (before: the
    unseen clients at the median of those sampled so far, off until all had been sampled);
    interrupted after round 2 and resumed, rounds 3-4 give what an uninterrupted run does."""
    def config(name: str, **kw):  # noqa: ANN202
        return _config(tiny_data, tmp_path, "hafedho", rounds=4, local_steps=1, fraction_train=0.5,
                       num_threads=1, partitioning="dirichlet", run_name=name, **kw)

    cfg = config("whole")
    sizes = partition_sizes(cfg, build_run(cfg)[2], 4)
    assert len(set(sizes)) == 4, sizes  # the hand computation can tell the partitions apart
    totals: list[float] = []

    def note(row: dict) -> None:
        totals.append(float(ServerState.load(out_dir / STATE_FILE).extras[wire.HAFEDHO_N_TOTAL]["n-total"]))

    out_dir = tmp_path / "out" / "whole"
    out = run_federated(_deployment_grid(cfg), cfg, on_round=note)
    rows = metric_rows(out)
    sampled = [sorted(int(n) - 1 for n in r["latency"]) for r in rows]  # node n holds partition n-1
    assert all(len(s) == 2 for s in sampled) and len({p for s in sampled for p in s}) > 2, sampled
    assert totals == [_by_hand(sizes)] * 4 == [float(sum(sizes))] * 4, (totals, sizes, sampled)
    assert totals[0] != sum(sizes[p] for p in sampled[0])  # not the cohort's sum (the old rule)

    class Interrupted(Exception):
        pass

    def stop_after_2(row: dict) -> None:
        if row["round"] == 2:
            raise Interrupted

    with pytest.raises(Interrupted):
        run_federated(_deployment_grid(config("cut")), config("cut"), on_round=stop_after_2)
    resumed = run_federated(_deployment_grid(config("cut", resume=True, overwrite=False)),
                            config("cut", resume=True, overwrite=False))
    ledger = ServerState.load(resumed / STATE_FILE).extras[LEDGER]
    whole = ServerState.load(out / STATE_FILE).extras[LEDGER]
    assert ledger["ids"].tolist() == whole["ids"].tolist()
    assert ledger["claims"].tolist() == whole["claims"].tolist() == [sizes[i] for i in whole["ids"].tolist()]
    assert ledger["ids"].tolist() == [0, 1, 2, 3]  # all four, from the census
    n_total = float(ServerState.load(resumed / STATE_FILE).extras[wire.HAFEDHO_N_TOTAL]["n-total"])
    assert n_total == totals[-1]


@pytest.mark.flower
@pytest.mark.skipif(shutil.which("flwr") is None, reason="the flwr CLI is not installed")
def test_under_flwr_simulation_every_node_answers_the_census_before_round_1(tiny_data, tmp_path) -> None:
    """`flwr run` simulation, 3 nodes, 1 of 3 sampled a round, Dirichlet partitions: the server
    holds no partitioning, so the census (a QUERY to each ClientApp) gives every partition's
    examples before round 1: |D| after round 1 is the partitions' sum, as the in-process engine
    (which holds the partitioning) has it, though round 1 heard from one client."""
    settings = {"num-server-rounds": 1, "local-steps": 1, "batch-size": 16, "num-threads": 1,
                "model": "'mlp'", "partitioning": "'dirichlet'", "fraction-train": 0.34, "seed": 7,
                "accept-small-rounds": "true",
                "data-dir": f"'{tiny_data['fashion-mnist']}'"}
    results = tmp_path / "results"
    overrides = " ".join(f"{k}={v}" for k, v in settings.items())
    try:
        done = flwr_run_simulation(tmp_path / "flwr-home", 3,
                                   f"{overrides} figures=false results-dir='{results}' run-name='sim' "
                                   "algorithm='hafedho'")
    finally:
        stop_local_superlink(tmp_path / "flwr-home")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert [r["replies-accepted"] for r in metric_rows(results / "sim")] == [1]
    cfg = _config(tiny_data, tmp_path, "hafedho", rounds=1, local_steps=1, partitioning="dirichlet", seed=7)
    sizes = partition_sizes(cfg, build_run(cfg)[2], 3)
    extras = ServerState.load(results / "sim" / STATE_FILE).extras
    assert extras[LEDGER]["ids"].tolist() == [0, 1, 2]
    assert extras[LEDGER]["claims"].tolist() == [float(n) for n in sizes]
    assert float(extras[wire.HAFEDHO_N_TOTAL]["n-total"]) == _by_hand(sizes) == sum(sizes)
