"""Rounds that sample fewer than three nodes are refused before round 1 (run_checks.py
`check_small_rounds`): one line naming the setting that samples 3 and `accept-small-rounds=true`,
no client contacted, no results folder left; with the key the same run trains. Measured why:
docs/robustness.md, "Rounds of one and two replies"."""

from __future__ import annotations

import pytest

from adaptfl.algorithms.config import RunConfig
from adaptfl.server_app.loop import run_federated
from adaptfl.server_app.run_checks import check_small_rounds
from tests.support.counting_grid import counting_grid
from tests.support.run_outputs import metric_rows


def test_the_refusal_names_both_ways_out_in_one_line() -> None:
    cfg = RunConfig.of(fraction_train=0.4)
    with pytest.raises(ValueError) as refused:
        check_small_rounds(cfg, 2, 5)
    line = str(refused.value)
    assert line.startswith("fraction-train=0.4 samples 2 of 5 nodes a round: ") and "\n" not in line, line
    assert "use fraction-train=0.6 (3 of 5 a round), or set accept-small-rounds=true" in line, line
    with pytest.raises(ValueError, match="use 3 or more nodes, or set accept-small-rounds=true"):
        check_small_rounds(RunConfig.of(), 2, 2)  # a federation of two
    check_small_rounds(cfg, 3, 5)  # three a round: nothing to accept
    check_small_rounds(cfg.replace(accept_small_rounds=True), 1, 5)


@pytest.mark.parametrize("static", [True, False])
@pytest.mark.slow
def test_a_run_of_two_nodes_is_refused_before_anything_is_sent(tmp_path, tiny_data, static: bool) -> None:  # noqa: ANN001
    """With the nodes known (the engine), or at round 1 under Flower, before any message."""
    cfg = RunConfig.of(model="mlp", num_server_rounds=1, local_steps=1, batch_size=8,
                       data_dir=tiny_data["fashion-mnist"],
                       figures=False, results_dir=str(tmp_path), run_name="t")
    grid, calls = counting_grid(2, cfg, static)
    with pytest.raises(ValueError, match="samples 2 of 2 nodes a round: .* accept-small-rounds=true"):
        run_federated(grid, cfg)
    assert calls == [] and not (tmp_path / "t").exists()
    accepted = cfg.replace(accept_small_rounds=True)
    grid, calls = counting_grid(2, accepted, static)
    rows = metric_rows(run_federated(grid, accepted))
    assert [r["replies-accepted"] for r in rows] == [2] and sorted(set(calls)) == [1, 2]
