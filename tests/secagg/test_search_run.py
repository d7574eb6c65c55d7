"""Whole SecAgg+ runs with nodes whose inputs are out of range (+1e9 on the masked vector). One
liar every round under secagg-liars=1: the rounds whose sum fails are skipped, the search names
it in the row and leaves it out, the run completes, and from the exclusion on the model is bit
for bit the one of the same run with that node disconnected. Two liars under secagg-liars=1
end the run saying the bound was exceeded; two colluders of five that frame an honest node
under the one-liar rule frame nobody under the default (strategies/secagg_search.py,
docs/secagg.md)."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterable

import numpy as np
import pytest
from flwr.app import Message

from adaptfl.algorithms.config import RunConfig
from adaptfl.core import wire
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.secagg import protocol as p
from adaptfl.server_app.loop import run_federated
from adaptfl.strategies.secagg_search import Search
from adaptfl.strategies.skips import RunAborted
from tests.secagg.test_search import framed
from tests.secagg.test_sum_check import _add
from tests.support.run_outputs import assert_same_model, final_model, metric_rows

NODES, LIAR, ROUNDS = 5, 3, 7


def lying_grid(cfg: RunConfig, liars: tuple[int, ...] = (LIAR,),
               when: Callable[[int, int], bool] = lambda node, server_round: True) -> InProcessGrid:
    """Each of `liars` adds 1e9 to its masked vector in the rounds `when(node, round)` says."""
    grid = InProcessGrid(NODES, cfg.to_flower())
    honest = grid.handler

    def lying(msg: Message, context) -> Message:  # noqa: ANN001
        rec = msg.content.config_records.get(wire.SECAGG)
        stage, server_round = (str(rec[p.STAGE]), int(rec[p.ROUND])) if rec is not None else ("", 0)
        reply = honest(msg, context)
        for liar in (n for n in liars if when(n, server_round)):
            reply = _add(liar, lambda n: np.full(n, 10 ** 9, dtype=np.int64))(stage, context.node_id, reply)
        return reply

    grid.handler = lying
    return grid


class WithoutLiar(InProcessGrid):
    """The same federation (partitions of NODES) with node LIAR never connected."""

    def get_node_ids(self) -> Iterable[int]:
        return [n for n in self.contexts if n != LIAR]


@pytest.mark.slow
def test_an_out_of_range_input_costs_its_sender_not_the_run(tiny_data, tmp_path) -> None:
    base = RunConfig.of(model="mlp", local_steps=2, batch_size=16, data_dir=tiny_data["fashion-mnist"],
                        secagg="secagg+", secagg_liars=1, algorithm="fedavg", run_name="run",
                        lr_schedule="constant")  # a cut run resumes on the same lr
    whole = base.replace(figures=False, results_dir=str(tmp_path / "whole"), num_server_rounds=ROUNDS,
                         client_state_dir=str(tmp_path / "whole" / "state"))
    rows = metric_rows(run_federated(lying_grid(whole), whole))  # completes: no RunAborted
    named = next(r["round"] for r in rows if "secagg-excluded" in r)
    assert list(rows[named - 1]["secagg-excluded"]) == [str(LIAR)], rows[named - 1]
    assert rows[named - 1]["secagg-narrowed"] and "beyond their reach" in rows[named - 1]["skip-reason"]
    failed = [r["round"] for r in rows if r["skipped"]]
    assert 2 <= len(failed) <= 4 and named == failed[-1], failed  # 1 + ⌈log2 5⌉ at most
    assert all("beyond their reach" in r["skip-reason"] for r in rows if r["skipped"])
    assert all(LIAR in r["secagg-suspects"] for r in rows[:named - 1] if r["skipped"])  # never cleared
    for row in rows[named:]:  # after it: every round is the four others', none skipped
        assert not row["skipped"] and row["replies-sampled"] == NODES - 1
        assert row["secagg-excluded"] == rows[named - 1]["secagg-excluded"]
    assert named + 1 < ROUNDS

    # the same run cut one round after the exclusion (a run of skipped rounds only is aborted),
    # resumed as it was, and resumed without the liar at all
    cut = base.replace(figures=False, results_dir=str(tmp_path / "cut"), num_server_rounds=named + 1,
                       client_state_dir=str(tmp_path / "cut" / "state"))
    run_federated(lying_grid(cut), cut)
    shutil.copytree(tmp_path / "cut", tmp_path / "absent")
    resumed = cut.replace(num_server_rounds=ROUNDS, resume=True)
    expected = final_model(run_federated(lying_grid(resumed), resumed))
    assert_same_model(final_model(tmp_path / "whole" / "run"), expected)  # the search resumes
    # FedAvg's nodes keep nothing between rounds (nothing they receive is sent unchanged later,
    # codec/versions.py): the cut left no state folder and the resume made none
    assert not (tmp_path / "absent" / "state").exists() and not (tmp_path / "cut" / "state").exists()
    absent = resumed.replace(figures=False, results_dir=str(tmp_path / "absent"))
    alone = run_federated(WithoutLiar(NODES, absent.to_flower()), absent)
    assert_same_model(final_model(alone), expected)


@pytest.mark.slow
def test_more_liars_than_declared_end_the_run_saying_so(tiny_data, tmp_path) -> None:
    """Nodes 3 and 5 lie every round under secagg-liars=1: once no one node was in every failed
    cohort, the row says so, the failures count again, and max-skipped-rounds ends the run."""
    cfg = RunConfig.of(model="mlp", local_steps=2, batch_size=16, data_dir=tiny_data["fashion-mnist"],
                       secagg="secagg+", secagg_liars=1, algorithm="fedavg", run_name="run",
                       figures=False, results_dir=str(tmp_path), num_server_rounds=12)
    with pytest.raises(RunAborted, match="consecutive rounds skipped"):
        run_federated(lying_grid(cfg, liars=(3, 5)), cfg)
    rows = metric_rows(tmp_path / "run")
    stopped = [r for r in rows if "secagg-search-stopped" in r]
    assert stopped and all(r["skipped"] and not r.get("secagg-narrowed") for r in stopped[-3:]), rows
    assert "more than secagg-liars=1 liars" in stopped[0]["secagg-search-stopped"]
    # (beyond the bound nothing holds: here honest node 4 was excluded before the search stopped)


@pytest.mark.slow
def test_two_colluders_of_five_taking_turns_get_no_honest_node_removed(tiny_data, tmp_path) -> None:
    """Nodes 3 and 5 lie in the rounds that, played against the one-liar rule (secagg-liars=1),
    get an honest node excluded (the search alone finds them: test_search.py's `framed`); under
    the default the same schedule frames nobody and the run completes, training in the rounds
    that pass."""
    schedule = framed(Search(), {3, 5}, 1, depth=8)
    base = RunConfig.of(model="mlp", local_steps=2, batch_size=16, data_dir=tiny_data["fashion-mnist"],
                        secagg="secagg+", algorithm="fedavg", figures=False, results_dir=str(tmp_path))
    for name, liars, rounds in (("one", 1, schedule[-1]), ("default", base.secagg.secagg_liars, 10)):
        cfg = base.replace(run_name=name, secagg_liars=liars, num_server_rounds=rounds)
        rows = metric_rows(run_federated(lying_grid(cfg, (3, 5), lambda _, r: r in schedule), cfg))
        framed_nodes = {n for r in rows for n in r.get("secagg-excluded", {})} - {"3", "5"}
        assert bool(framed_nodes) == (liars == 1), (name, rows[-1])  # one honest node: the old rule
    assert [r["round"] for r in rows if r["skipped"]] == schedule and len(rows) == 10  # completed
