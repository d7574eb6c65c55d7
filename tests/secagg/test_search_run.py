"""A whole SecAgg+ run with one node whose input is out of range every round (+1e9 on its masked
vector): the rounds whose sum fails are skipped, the search names that node in the row and
leaves it out, the run completes, and from the exclusion on the model is bit for bit the one of
the same run with that node disconnected (strategies/secagg_search.py, docs/secagg.md)."""

from __future__ import annotations

import shutil
from collections.abc import Iterable

import numpy as np
import pytest
from flwr.app import Message

from adaptfl.algorithms.config import RunConfig
from adaptfl.core import wire
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.secagg import protocol as p
from adaptfl.server_app.loop import run_federated
from tests.secagg.test_sum_check import _add
from tests.support.run_outputs import assert_same_model, final_model, metric_rows

NODES, LIAR, ROUNDS = 5, 3, 7


def lying_grid(cfg: RunConfig) -> InProcessGrid:
    """Node LIAR adds 1e9 to its masked vector in every round."""
    grid = InProcessGrid(NODES, cfg.to_flower())
    honest = grid.handler

    def lying(msg: Message, context) -> Message:  # noqa: ANN001
        rec = msg.content.config_records.get(wire.SECAGG)
        stage = str(rec[p.STAGE]) if rec is not None else ""
        reply = honest(msg, context)
        return _add(LIAR, lambda n: np.full(n, 10 ** 9, dtype=np.int64))(stage, context.node_id, reply)

    grid.handler = lying
    return grid


class WithoutLiar(InProcessGrid):
    """The same federation (partitions of NODES) with node LIAR never connected."""

    def get_node_ids(self) -> Iterable[int]:
        return [n for n in self.contexts if n != LIAR]


@pytest.mark.slow
def test_an_out_of_range_input_costs_its_sender_not_the_run(tiny_data, tmp_path) -> None:
    base = RunConfig.of(model="mlp", local_steps=2, batch_size=16, data_dir=tiny_data["fashion-mnist"],
                        secagg="secagg+", algorithm="fedavg", run_name="run",
                        lr_schedule="constant")  # a cut run resumes on the same lr
    whole = base.replace(results_dir=str(tmp_path / "whole"), num_server_rounds=ROUNDS,
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
    assert named < ROUNDS

    # the same run cut at the exclusion, resumed as it was, and resumed without the liar at all
    # the nodes keep their state (the records they hold) inside the run's folder, copied with it
    cut = base.replace(results_dir=str(tmp_path / "cut"), num_server_rounds=named,
                       client_state_dir=str(tmp_path / "cut" / "state"))
    run_federated(lying_grid(cut), cut)
    shutil.copytree(tmp_path / "cut", tmp_path / "absent")
    resumed = cut.replace(num_server_rounds=ROUNDS, resume=True)
    expected = final_model(run_federated(lying_grid(resumed), resumed))
    assert_same_model(final_model(tmp_path / "whole" / "run"), expected)  # the search resumes
    # the nodes' state as the cut left it (the resume above moved it on); the run config, and
    # so the state folder, is the cut run's
    shutil.rmtree(tmp_path / "cut" / "state")
    shutil.copytree(tmp_path / "absent" / "state", tmp_path / "cut" / "state")
    absent = resumed.replace(results_dir=str(tmp_path / "absent"))
    alone = run_federated(WithoutLiar(NODES, absent.to_flower()), absent)
    assert_same_model(final_model(alone), expected)
