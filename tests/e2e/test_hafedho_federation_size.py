"""HaFedHo's |D| as seed 003 defines it (Algorithm 1: p_i = |D_i| / |D|, |D| the federation's
examples) under partial participation, and partition ids checked against the partitioning,
where the server knows it (the in-process engine: partition ids 0..N-1 of the run's own
partitioning). Before, |D| was the num-examples of the round's replies summed: with 2 of 4
sampled the cohort's size, and a liar's raw claim went into the broadcast n-total."""

from __future__ import annotations

from adaptfl.core import wire
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.server_app.checkpoint import STATE_FILE
from adaptfl.server_app.loop import run_federated
from adaptfl.strategies.state import ServerState
from tests.e2e.test_hostile_e2e import _config, hostile
from tests.support.run_outputs import metric_rows

TRAIN_ROWS = 600  # tiny_data's Fashion-MNIST training rows, all of them in some partition (iid)


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
