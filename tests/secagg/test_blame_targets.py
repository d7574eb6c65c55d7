"""SecAgg+ blame against garbage aimed at a few peers (secagg/server.py `_check_shares`): a node
that sends garbage to one peer, or two colluders that send it to one honest node, are the ones
removed and named, never their receiver; the round starts again without them before any input is
masked, so the honest nodes' exact sum comes out whatever order the replies arrive in. A share
off its owner's polynomial (it passes its hash) no longer decides the round by reply order."""

from __future__ import annotations

import itertools
import secrets

import numpy as np
import pytest
from flwr.app import Message

from adaptfl.core import wire
from adaptfl.secagg import crypto
from adaptfl.secagg import protocol as p
from tests.secagg.test_blame import POSITIONS, OrderedGrid, grids_made, run
from tests.secagg.test_protocol import plain_sum


def garbage_to(senders: set[int], receivers: set[int]):  # noqa: ANN201
    """A tamper: each of `senders` sends random bytes, in place of its shares, to `receivers`."""
    def tamper(stage: str, node: int, reply: Message) -> Message:
        if stage == p.SHARE_KEYS and node in senders:
            rec = reply.content.config_records[wire.SECAGG]
            for holder in receivers & {int(k) for k in rec if k.isdigit()}:
                rec[str(holder)] = secrets.token_bytes(len(rec[str(holder)]))
        return reply
    return tamper


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("liar,victim", [(1, 2), (3, 5), (5, 1)])
def test_garbage_to_one_peer_of_five_removes_the_sender_alone(liar: int, victim: int, position: str) -> None:
    """t = 4 of 5: once the receiver cannot open the sender's shares, only 3 honest holders are
    left of its mask key; the sender is removed before it masks anything, so none is needed."""
    out, state, why, bound, _ = run(garbage_to({liar}, {victim}), liar, POSITIONS[position])
    honest = [n for n in range(1, 6) if n != liar]
    assert why == "" and out.live == honest and np.array_equal(out.total, plain_sum(honest, bound))
    assert list(state.dropped) == [liar]
    assert f"its shares to node {victim} do not decrypt" in state.dropped[liar]


@pytest.mark.parametrize("position", POSITIONS)
def test_garbage_to_two_peers_of_seven_removes_the_sender_alone(position: str) -> None:
    out, state, why, bound, _ = run(garbage_to({4}, {2, 6}), 4, POSITIONS[position], num_nodes=7)
    honest = [1, 2, 3, 5, 6, 7]
    assert why == "" and out.live == honest and np.array_equal(out.total, plain_sum(honest, bound))
    assert list(state.dropped) == [4]


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("nodes,colluders,victim", [(5, {2, 4}, 3), (5, {1, 5}, 3), (7, {1, 4, 6}, 2)])
def test_colluders_framing_an_honest_node_are_the_ones_removed(nodes: int, colluders: set[int], victim: int,
                                                               position: str) -> None:
    """2 of 5 (3 of 7) send garbage to one honest node: it reports them instead of failing, each
    is named, and the honest nodes (the victim among them) are summed exactly."""
    liar = min(colluders)
    out, state, why, bound, _ = run(garbage_to(colluders, {victim}), liar, POSITIONS[position],
                                    num_nodes=nodes)
    honest = [n for n in range(1, nodes + 1) if n not in colluders]
    assert why == "", why
    assert out.live == honest and victim in out.live and np.array_equal(out.total, plain_sum(honest, bound))
    assert sorted(state.dropped) == sorted(colluders)
    assert all(f"its shares to node {victim}" in state.dropped[c] for c in colluders), state.dropped


def test_the_outcome_does_not_depend_on_reply_order() -> None:
    """Garbage from node 2 to node 4, the liar's and the victim's replies delivered in every
    order: one and the same sum and the same node named."""
    outcomes = set()
    for position, first in itertools.product(range(5), (2, 4, None)):
        out, state, why, bound, _ = run(garbage_to({2}, {4}), 2, position, deliver_first=first)
        outcomes.add((why, tuple(out.live), out.total.tobytes(), tuple(sorted(state.dropped))))
    assert len(outcomes) == 1, outcomes


@pytest.mark.parametrize("position", range(5))
def test_a_share_off_its_owners_polynomial_does_not_decide_the_round_by_order(position: int) -> None:
    """Node 3 hands node 1 a b-share with one bit changed, encrypted and hashed as sent, so it
    passes every check: the first 4 shares by holder hold it and rebuild another seed, which
    fails node 3's commitment; the 4 others rebuild it. The round completes with the exact sum
    whichever reply comes first."""
    grids: list[OrderedGrid] = []

    def tamper(stage: str, node: int, reply: Message) -> Message:
        if stage == p.SHARE_KEYS and node == 3:
            state = grids[0].contexts[3].state.config_records["adaptfl-secagg"]
            rec = reply.content.config_records[wire.SECAGG]
            key = state["k-enc:1"]
            src, dst, b_share, s_share = crypto.share_keys_plaintext_separate(crypto.decrypt(key, rec["1"]))
            b_share = b_share[:-1] + bytes([b_share[-1] ^ 0x01])
            rec["1"] = crypto.encrypt(key, crypto.share_keys_plaintext_concat(src, dst, b_share, s_share))
            rec[f"{p.HASH_B}:1"] = crypto.share_digest(3, 1, "b", b_share)
        return reply

    with grids_made(grids):
        out, state, why, bound, _ = run(tamper, 1, position)
    assert why == "" and out.live == [1, 2, 3, 4, 5], why
    assert np.array_equal(out.total, plain_sum(out.live, bound)) and not state.dropped
