"""The server's check on the unmasked sum (fixedpoint.beyond_reach): a node that adds 1e9 to its
masked vector, or sends an integer beyond its range, gets the round refused, naming the record
and how many of its coordinates are out of reach, and in a whole run the model is unchanged;
honest rounds (with dp's noise too) pass; a lie inside the range passes, as docs/secagg.md says."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Message

from adaptfl.algorithms.config import RunConfig
from adaptfl.core import wire
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.secagg import fixedpoint
from adaptfl.secagg import protocol as p
from adaptfl.server_app.loop import run_federated
from tests.secagg.test_protocol import SIZE, plain_sum, run_round
from tests.support.run_outputs import assert_same_model, final_model, metric_rows

BITS = 32


def _add(node: int, extra) -> object:  # noqa: ANN001 - extra: y's length -> what node adds
    """A tamper that adds `extra` to `node`'s masked vector mod 2^32 (y + e = q + e + masks)."""
    def tamper(stage: str, who: int, reply: Message) -> Message:
        if stage == p.MASKED_INPUT and who == node:
            y = reply.content.array_records[wire.MASKED][p.MASKED_ARRAY].numpy().astype(np.uint64)
            shifted = (y + fixedpoint.to_ring(extra(len(y)), BITS)) & np.uint64(2 ** BITS - 1)
            reply.content[wire.MASKED] = ArrayRecord({p.MASKED_ARRAY: Array(shifted.astype(np.uint32))})
        return reply
    return tamper


def test_the_ring_keeps_room_beyond_what_honest_inputs_reach() -> None:
    bound = fixedpoint.budget(BITS, 5)
    assert bound == (2 ** 29 - 1) // 5  # 2 guard bits: n·B <= 2^(m-1-2)
    assert fixedpoint.reach(bound, 5, 0.0) == 5 * bound
    assert fixedpoint.reach(bound, 4, 100.0) == pytest.approx(4 * bound + 10 * 100.0 * 2)


def test_a_node_adding_1e9_to_its_masked_vector_gets_the_round_refused() -> None:
    out, state, why, bound = run_round(tamper=_add(2, lambda n: np.full(n, 10 ** 9, dtype=np.int64)))
    assert out is None and state.total is None
    assert "beyond their reach" in why and "of 'delta'" in why and "\n" not in why, why
    # each coordinate lands past 5·B unless the honest sum sat below -(1e9 - 5·B): counted exactly
    honest = plain_sum([1, 2, 3, 4, 5], bound)[:SIZE + 3]
    out_of_reach = int(np.count_nonzero(np.abs(honest + 10 ** 9) > 5 * bound))
    assert out_of_reach > 0 and f"on {out_of_reach} of {SIZE + 3} coordinates" in why, why


def test_one_integer_beyond_the_range_gets_the_round_refused_naming_its_record() -> None:
    """Node 2 sends q = 10·B on v's first value: 9·B beyond its range, 4·B past the cohort's reach."""
    def extra(n: int) -> np.ndarray:
        e = np.zeros(n, dtype=np.int64)
        e[SIZE + 3] = 10 * fixedpoint.budget(BITS, 5)
        return e

    out, _, why, _ = run_round(tamper=_add(2, extra))
    assert out is None and "on 1 of 40 coordinates of 'v'" in why, why


def test_honest_rounds_pass_with_and_without_the_noise() -> None:
    for sigma in (0.0, 2000.0):
        out, _, why, _ = run_round(noise_std=sigma)
        assert why == "" and out.live == [1, 2, 3, 4, 5]


def test_a_lie_inside_the_range_passes_the_check() -> None:
    """Node 2 sends B - q_2 on Δ's first value: in range, so in the sum; nothing can see it."""
    bound = fixedpoint.budget(BITS, 5)
    mine = int(plain_sum([2], bound)[0])

    def extra(n: int) -> np.ndarray:
        e = np.zeros(n, dtype=np.int64)
        e[0] = bound - 2 * mine if mine > 0 else -bound - 2 * mine
        return e

    out, _, why, _ = run_round(tamper=_add(2, extra))
    assert why == "" and out.total[0] != plain_sum(out.live, bound)[0]


@pytest.mark.slow
def test_in_a_whole_run_the_refused_round_leaves_the_model_unchanged(tiny_data, tmp_path) -> None:  # noqa: ANN001
    """Two rounds of 3 nodes, node 2 adding 1e9 in round 2: round 2 is skipped with the reason
    and the model is the one after round 1 (a one-round run's), bit for bit."""
    cfg = RunConfig.of(model="mlp", local_steps=2, batch_size=16, data_dir=tiny_data["fashion-mnist"],
                       figures=False, results_dir=str(tmp_path), secagg="secagg+", algorithm="fedavg")
    one = cfg.replace(run_name="one", num_server_rounds=1)
    expected = final_model(run_federated(InProcessGrid(3, one.to_flower()), one))
    two = cfg.replace(run_name="two", num_server_rounds=2)
    grid = InProcessGrid(3, two.to_flower())
    honest = grid.handler

    def lying(msg: Message, context) -> Message:  # noqa: ANN001
        cfg = msg.content.config_records.get(wire.SECAGG)
        stage, server_round = (str(cfg[p.STAGE]), int(cfg[p.ROUND])) if cfg is not None else ("", 0)
        reply = honest(msg, context)  # which takes the secagg record off the instruction
        if stage == p.MASKED_INPUT and server_round == 2:
            reply = _add(2, lambda n: np.full(n, 10 ** 9, dtype=np.int64))(stage, context.node_id, reply)
        return reply

    grid.handler = lying
    out = run_federated(grid, two)
    rows = metric_rows(out)
    assert not rows[0]["skipped"] and rows[1]["skipped"]
    assert "beyond their reach" in rows[1]["skip-reason"] and "'delta'" in rows[1]["skip-reason"]
    assert_same_model(final_model(out), expected)
