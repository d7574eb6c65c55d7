"""Blame in SecAgg+ (secagg/blame.py): one disruptive node of five (or seven) — garbage
ciphertexts, a share changed at unmask, a copied or repeated public key, a false accusation, a
wrong commitment — is named, never an honest node, with its reply first, in the middle or last;
it leaves the round and the others' exact sum comes out while t shares allow, and where they
cannot the refusal names it."""

from __future__ import annotations

import contextlib
import math
import secrets
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, RecordDict

from adaptfl.core import wire
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.secagg import fixedpoint
from adaptfl.secagg import protocol as p
from adaptfl.secagg.server import SecAggServer, SecureRefused
from tests.secagg.test_protocol import BITS, Nodes, plain_sum, slots

POSITIONS = {"first": 0, "middle": 2, "last": 4}


class OrderedGrid(InProcessGrid):
    """Delivers to `deliver_first` before the others, and hands the server the replies with the
    liar's at `position` (the honest ones in node order around it)."""

    def __init__(self, num_nodes: int, liar: int, position: int, deliver_first: int | None = None) -> None:
        super().__init__(num_nodes, {})
        self.liar, self.position, self.first = liar, position, deliver_first

    def send_and_receive(self, messages, *, timeout=None):  # noqa: ANN001, ANN201
        messages = sorted(messages, key=lambda m: m.metadata.dst_node_id != self.first)
        replies = sorted(super().send_and_receive(messages, timeout=timeout),
                         key=lambda r: r.metadata.src_node_id)
        mine = [r for r in replies if r.metadata.src_node_id == self.liar]
        others = [r for r in replies if r.metadata.src_node_id != self.liar]
        return others[:self.position] + mine + others[self.position:]


@contextlib.contextmanager
def grids_made(grids: list[OrderedGrid]) -> Iterator[None]:
    """Collect every OrderedGrid made inside (a tamper reads a node's own SecAgg+ state from its
    grid's contexts), then restore the class."""
    original = OrderedGrid.__init__

    def init(self: OrderedGrid, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        grids.append(self)

    OrderedGrid.__init__ = init  # type: ignore[method-assign]
    try:
        yield
    finally:
        OrderedGrid.__init__ = original  # type: ignore[method-assign]


def run(tamper, liar: int, position: int, num_nodes: int = 5, deliver_first: int | None = None):  # noqa: ANN001, ANN201
    bound = fixedpoint.budget(BITS, num_nodes)
    grid = OrderedGrid(num_nodes, liar, min(position, num_nodes - 1), deliver_first)
    nodes = Nodes(bound, tamper=tamper)
    grid.handler = nodes
    shares = min(11, num_nodes)
    server = SecAggServer(shares, math.ceil(0.66 * shares), BITS, bound, 0.0, None, seed=3, server_round=1)
    try:
        out = server.run(grid, list(range(1, num_nodes + 1)), RecordDict({wire.RECIPE: ConfigRecord({})}),
                         slots(bound), {"delta": float(bound), "v": float(bound), "f-hat": float(bound)})
    except SecureRefused as why:
        return None, server.out, str(why), bound, grid
    return out, server.out, "", bound, grid


def _only(dropped: dict[int, str], liar: int, says: str) -> None:
    assert list(dropped) == [liar], dropped
    assert says in dropped[liar], dropped[liar]


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("liar", [1, 3, 5])
def test_garbage_ciphertexts_name_their_sender_and_the_others_are_summed(liar: int, position: str) -> None:
    def tamper(stage: str, node: int, reply: Message) -> Message:
        if stage == p.SHARE_KEYS and node == liar:
            rec = reply.content.config_records[wire.SECAGG]
            for key in [k for k in rec if k.isdigit()]:
                rec[key] = secrets.token_bytes(len(rec[key]))
        return reply

    out, state, why, bound, _ = run(tamper, liar, POSITIONS[position])
    assert why == "", why
    honest = [n for n in range(1, 6) if n != liar]
    assert out.live == honest and np.array_equal(out.total, plain_sum(honest, bound))
    _only(state.dropped, liar, "do not decrypt")


@pytest.mark.parametrize("position", POSITIONS)
def test_one_garbage_ciphertext_of_seven_nodes_leaves_the_others_sum(position: str) -> None:
    """Node 4 sends garbage to node 6 alone: node 6 does not mask with it, the other five do and
    hold its mask key's shares (t = 5), which the server rebuilds to take its masks out."""
    def tamper(stage: str, node: int, reply: Message) -> Message:
        if stage == p.SHARE_KEYS and node == 4:
            rec = reply.content.config_records[wire.SECAGG]
            rec["6"] = rec["6"][:-8] + bytes(8)
        return reply

    out, state, why, bound, _ = run(tamper, 4, POSITIONS[position] + 1, num_nodes=7)
    honest = [1, 2, 3, 5, 6, 7]
    assert why == "" and out.live == honest and np.array_equal(out.total, plain_sum(honest, bound))
    _only(state.dropped, 4, "its shares to node 6 do not decrypt")


@pytest.mark.parametrize("spoil", ["bit-flip", "garbage"])
@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("liar", [1, 3, 5])
def test_a_spoiled_unmask_share_names_its_holder_and_the_sum_is_exact(liar: int, position: str,
                                                                      spoil: str) -> None:
    def tamper(stage: str, node: int, reply: Message) -> Message:
        if stage == p.UNMASK and node == liar:
            rec = reply.content.config_records[wire.SECAGG]
            for key, value in list(rec.items()):
                rec[key] = value[:-1] + bytes([value[-1] ^ 0x01]) if spoil == "bit-flip" \
                    else secrets.token_bytes(len(value) + 3)
        return reply

    out, state, why, bound, _ = run(tamper, liar, POSITIONS[position])
    assert why == "", why
    assert out.live == [1, 2, 3, 4, 5] and np.array_equal(out.total, plain_sum(out.live, bound))
    _only(state.dropped, liar, "unmask: returned a share of node")  # its y was in before unmasking


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("liar", [1, 3, 5])
def test_a_copied_public_key_names_the_copier_never_its_owner(liar: int, position: str) -> None:
    """The liar signs up with node 2's (or 4's) keys and proofs, copied whole: the proofs bind
    the owner's node id, so the copier's fail; the owner stays, whichever reply came first."""
    victim = 2 if liar != 2 else 4
    seen: dict[int, ConfigRecord] = {}

    def tamper(stage: str, node: int, reply: Message) -> Message:
        if stage == p.SETUP and node == victim:
            seen[victim] = ConfigRecord(dict(reply.content.config_records[wire.SECAGG]))
        if stage == p.SETUP and node == liar:  # the victim's keys under the liar's neighbours' names
            rec = reply.content.config_records[wire.SECAGG]
            copied = list(v for k, v in seen[victim].items() if k.startswith(p.PK_ENC))
            for key in [k for k in rec if k.startswith(p.PK_ENC)]:
                rec[key] = copied.pop()
            rec[p.PK_MASK] = seen[victim][p.PK_MASK]
            rec[f"{p.PROOF}:{p.PK_MASK}"] = seen[victim][f"{p.PROOF}:{p.PK_MASK}"]
        return reply

    out, state, why, bound, _ = run(tamper, liar, POSITIONS[position], deliver_first=victim)
    honest = [n for n in range(1, 6) if n != liar]
    assert why == "" and out.live == honest and np.array_equal(out.total, plain_sum(honest, bound))
    _only(state.dropped, liar, "setup: ")
    assert "proves it holds" in state.dropped[liar]


@pytest.mark.parametrize("position", POSITIONS)
def test_one_key_signed_up_twice_names_its_node(position: str) -> None:
    """Node 3 uses one encryption key for two neighbours (its proofs hold: it has the key)."""
    def tamper(stage: str, node: int, reply: Message) -> Message:
        if stage == p.SETUP and node == 3:
            rec = reply.content.config_records[wire.SECAGG]
            for name in (p.enc_key(2), f"{p.PROOF}:{p.enc_key(2)}"):
                rec[name] = rec[name.replace("2", "1")]
        return reply

    out, state, why, _, _ = run(tamper, 3, POSITIONS[position])
    assert why == "" and out.live == [1, 2, 4, 5]
    assert list(state.dropped) == [3] and state.dropped[3].startswith("setup: ")


@pytest.mark.parametrize("position", POSITIONS)
def test_a_false_accusation_names_the_accuser_never_the_accused(position: str) -> None:
    """Node 2 reports node 4's shares as garbage, with its true pair key: the server opens them,
    they are as node 4 hashed them, so node 2 is named and leaves; node 4 stays."""
    grids: list[OrderedGrid] = []

    def tamper(stage: str, node: int, reply: Message) -> Message:
        if stage == p.CHECK_SHARES and node == 2:
            state = grids[0].contexts[2].state.config_records["adaptfl-secagg"]
            reply.content[wire.SECAGG] = ConfigRecord({f"{p.BLAME}:4": state["sk-enc:4"]})
        return reply

    with grids_made(grids):
        out, state, why, bound, _ = run(tamper, 2, POSITIONS[position])
    assert why == "" and out.live == [1, 3, 4, 5]
    assert np.array_equal(out.total, plain_sum([1, 3, 4, 5], bound))
    _only(state.dropped, 2, "blamed node 4, whose shares to it open as hashed")


@pytest.mark.parametrize("position", POSITIONS)
def test_a_wrong_commitment_refuses_the_round_naming_its_node(position: str) -> None:
    """Node 5 commits to another seed than it shares: its input is in the sum, its self mask
    cannot be checked, so the round is refused (never a wrong sum), naming node 5."""
    def tamper(stage: str, node: int, reply: Message) -> Message:
        if stage == p.SHARE_KEYS and node == 5:
            reply.content.config_records[wire.SECAGG][p.COMMIT] = bytes(32)
        return reply

    out, state, why, _, _ = run(tamper, 5, POSITIONS[position])
    assert out is None and state.total is None
    assert why.startswith("secagg+: node 5's self-mask seed") and "commitment" in why, why


@pytest.mark.slow
@pytest.mark.parametrize("attack", ["garbage ciphertexts", "garbage to one peer", "bit-flipped unmask shares",
                                    "copied public keys"])
def test_a_whole_run_with_a_disruptive_node_names_it_alone(tiny_data, tmp_path, attack: str) -> None:  # noqa: ANN001
    """Under the defaults, 5 nodes, 2 rounds, node 5 disrupting every round
    (benchmarks/secagg_liars.py's attacks): both rounds complete and every row names node 5 alone."""
    from adaptfl.algorithms.config import RunConfig
    from adaptfl.server_app.loop import run_federated
    from benchmarks import secagg_liars
    from tests.support.run_outputs import metric_rows

    cfg = RunConfig.of(model="mlp", num_server_rounds=2, local_steps=2, batch_size=16, secagg="secagg+",
                       data_dir=tiny_data["fashion-mnist"],
                       figures=False, results_dir=str(tmp_path), run_name="r")
    grid = InProcessGrid(5, cfg.to_flower(), handler=secagg_liars.handler(secagg_liars.ATTACKS[attack]))
    rows = metric_rows(run_federated(grid, cfg))
    assert [r["skipped"] for r in rows] == [False, False]
    assert all(list(r["rejected"]) == ["5"] for r in rows), [r["rejected"] for r in rows]
