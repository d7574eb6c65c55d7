"""Every shared record is screened and bounded (issue 32 §2-3), end to end: one hostile client
of five, through the in-process engine on small real data, rewrites one uploaded record (not
Δ) of its honest reply, in round 1 only or every round. On main each was accepted: SCAFFOLD's
Δc of 1e30 went into c, every honest reply of rounds 2-4 was then non-finite and the run
aborted (exit 3); Θ = 1e30 (fedpac-sophia) and f̂ = -1e30 (HaFedHo) went into the state too.
Now the reply is dropped with a reason naming the record, and the run ends within MARGIN of
the clean run's accuracy. A reply alone in its round is screened against the screen history
(the median size of the last kept replies, kept in the server state)."""

from __future__ import annotations

import pytest
import torch

from adaptfl.algorithms.config import RunConfig
from adaptfl.core import wire
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.server_app.checkpoint import STATE_FILE
from adaptfl.server_app.loop import run_federated
from adaptfl.strategies.screen import HISTORY
from adaptfl.strategies.state import ServerState
from tests.e2e.test_hostile_e2e import Rewrite
from tests.e2e.test_hostile_e2e import hostile as hostile_handler
from tests.support.run_outputs import final_model, metric_rows

MARGIN = 0.05  # of the tiny test split's accuracy
ROUNDS = 3


def _config(tiny_data, tmp_path, algorithm: str, name: str, **kw) -> RunConfig:
    values = dict(algorithm=algorithm, model="mlp", num_server_rounds=ROUNDS, local_steps=5,
                  batch_size=16, data_dir=tiny_data["fashion-mnist"], partitioning="iid", seed=1,
                  figures=False, results_dir=str(tmp_path / "out"), run_name=name,
                  client_state_dir=str(tmp_path / f"state-{name}"), overwrite=True,
                  accept_small_rounds=True)  # some tests sample one or two of five nodes a round
    return RunConfig.of(**{**values, **kw})


def hostile(rewrite: Rewrite, rounds: set[int] | None, partition: int | None = 0):  # noqa: ANN201
    """test_hostile_e2e's handler, in `rounds` only (None: every round)."""
    return hostile_handler(rewrite, partition, rounds)


def _entry(record: str, value: float, key: str = "") -> Rewrite:
    """One entry of `record` (its first floating array whose name contains `key`) set to `value`."""
    def rewrite(arrays: dict, metrics: dict) -> None:
        t = next(t for n, t in arrays[record].items() if t.is_floating_point() and key in n)
        t.view(-1)[0] = value
    return rewrite


def _f_hat(value: float) -> Rewrite:
    def rewrite(arrays: dict, metrics: dict) -> None:
        metrics[wire.F_HAT] = value
    return rewrite


# (algorithm, rewrite, the hostile reply's reason contains)
ATTACKS = {
    "scaffold-dc-1e30": ("scaffold", _entry(wire.DELTA_C, 1e30), "delta-c["),
    "scaffold-dc-1e15": ("scaffold", _entry(wire.DELTA_C, 1e15), "screened: delta-c norm"),
    "fedpac-sophia-theta-1e30": ("fedpac-sophia", _entry(wire.THETA_LOCAL, 1e30, "hessian"),
                                 "theta-i["),
    "hafedho-f-hat-minus-1e30": ("hafedho", _f_hat(-1e30), "metrics[f-hat]"),
}
_CLEAN: dict[str, float] = {}


def _clean(tiny_data, tmp_path, algorithm: str) -> float:
    if algorithm not in _CLEAN:  # one clean run per algorithm for the module
        cfg = _config(tiny_data, tmp_path, algorithm, f"{algorithm}-clean")
        out = run_federated(InProcessGrid(5, cfg.to_flower()), cfg)
        _CLEAN[algorithm] = metric_rows(out)[-1]["test-accuracy"]
    return _CLEAN[algorithm]


@pytest.mark.parametrize("when", ["round-1", "every-round"])
@pytest.mark.parametrize("attack", sorted(ATTACKS))
@pytest.mark.slow
def test_one_hostile_upload_is_dropped_and_the_run_ends_near_the_clean_one(attack, when, tiny_data,
                                                                          tmp_path) -> None:
    algorithm, rewrite, reason = ATTACKS[attack]
    rounds = {1} if when == "round-1" else None
    cfg = _config(tiny_data, tmp_path, algorithm, f"{algorithm}-{when}")
    out = run_federated(InProcessGrid(5, cfg.to_flower(), handler=hostile(rewrite, rounds)), cfg)
    rows = metric_rows(out)
    assert len(rows) == ROUNDS and not any(r.get("skipped") for r in rows), rows
    for row in rows if rounds is None else rows[:1]:
        assert list(row["rejected"]) == ["1"], row["rejected"]  # partition 0 is node 1
        assert reason in row["rejected"]["1"], row["rejected"]
        assert row["replies-accepted"] == 4
    state = ServerState.load(out / STATE_FILE)
    assert all(bool(torch.isfinite(t).all()) and float(t.abs().max()) < 1e6
               for tensors in state.extras.values() for t in tensors.values() if t.is_floating_point())
    assert all(bool(torch.isfinite(t).all()) for t in final_model(out).values() if t.is_floating_point())
    clean = _clean(tiny_data, tmp_path, algorithm)
    assert abs(rows[-1]["test-accuracy"] - clean) <= MARGIN, (rows[-1]["test-accuracy"], clean)


@pytest.mark.slow
def test_a_reply_alone_in_its_round_is_screened_against_the_reference(tiny_data, tmp_path) -> None:
    """fraction-train 0.2 of 5 nodes: one reply a round. Round 1's honest one sets the screen
    reference (kept in state.pt); round 2's, with one Δ entry of 1e30 (finite: fedavg's Δ
    domain), is screened against it, the round skipped and the state kept."""
    cfg = _config(tiny_data, tmp_path, "fedavg", "lone", fraction_train=0.2, min_replies=1)
    rewrite = _entry(wire.DELTA, 1e30)
    out = run_federated(InProcessGrid(5, cfg.to_flower(), handler=hostile(rewrite, {2}, None)), cfg)
    rows = metric_rows(out)
    assert [r["replies-sampled"] for r in rows] == [1] * ROUNDS
    assert rows[0]["rejected"] == {} and rows[2]["rejected"] == {}
    (why,) = rows[1]["rejected"].values()
    assert why.startswith("screened: delta norm") and "screen reference" in why, why
    assert rows[1]["replies-accepted"] == 0
    weights = final_model(out)
    assert max(float(t.abs().max()) for t in weights.values() if t.is_floating_point()) < 100.0
    assert wire.DELTA in ServerState.load(out / STATE_FILE).extras[HISTORY]
