"""Partition ownership that a liar cannot take first (issue 32 §4): under partial participation a
node claiming another's partition id before the owner was sampled held it, and the owner was
dropped ("partition-id=1 belongs to node 1, which held it first"). Now the owner is never dropped
in the thief's favour: the id is quarantined (both dropped, with the reason) until an operator's
partition-map names the owner; and a map, where given, is the binding."""

from __future__ import annotations

import json

import pytest

from adaptfl.algorithms.config import RunConfig
from adaptfl.core import wire
from adaptfl.server_app.checkpoint import CONFIG_FILE, check_same_job
from adaptfl.strategies.ownership import Ownership, bind_by_claims, bind_by_map
from adaptfl.strategies.state import ServerState
from tests.strategies.test_hostile_replies import HOSTILE, _honest, _round, _strategy

ALL = range(1, 6)
OWN = {n: n - 1 for n in ALL}  # node n's true partition id


def _claims(**by_node: int) -> dict[int, dict[str, int]]:
    return {int(n.removeprefix("n")): {wire.PARTITION_ID: pid} for n, pid in by_node.items()}


def test_a_thief_that_claims_first_never_keeps_the_owners_id() -> None:
    """The issue's run: node 5 claims node 1's id while node 1 is not sampled."""
    strategy = _strategy("fedavg")
    replies = {n: _honest(strategy, n) for n in (2, 3, HOSTILE)}
    replies[HOSTILE]["metrics"][wire.PARTITION_ID] = 0
    _round(strategy, replies)  # node 1 not sampled: the thief binds 0 for now
    assert strategy.state.partition_owners == {0: HOSTILE, 1: 2, 2: 3}
    replies = {n: _honest(strategy, n) for n in (1, 2, HOSTILE)}
    replies[HOSTILE]["metrics"][wire.PARTITION_ID] = 0
    _round(strategy, replies)  # the owner arrives: neither keeps 0
    why = ("partition-id=0 is quarantined: claimed by nodes 1, 5; node 5 held it before nodes 1 "
           "were first seen; partition-map must name its owner")
    assert strategy.report.rejected == {"1": why, "5": why}
    assert strategy.report.accepted == 1 and 0 not in strategy.state.partition_owners
    _round(strategy, {n: _honest(strategy, n) for n in (1, 2)})  # the thief away: still quarantined
    assert set(strategy.report.rejected) == {"1"}
    assert "partition-id=0 is quarantined: claimed by nodes 1, 5" in strategy.report.rejected["1"]
    assert strategy.state.ownership.quarantined == {0: [1, HOSTILE]}


def test_the_owner_arriving_alone_after_a_theft_is_quarantined_not_dropped_for_the_thief() -> None:
    ledger = Ownership()
    assert bind_by_claims(_claims(n5=0, n2=1), ledger, ALL) == {}
    dropped = bind_by_claims(_claims(n1=0), ledger, ALL)  # the thief not sampled this round
    assert list(dropped) == [1] and "quarantined: claimed by nodes 1, 5" in dropped[1]
    assert bind_by_claims(_claims(n5=0), ledger, ALL)[5].startswith("partition-id=0 is quarantined")
    assert ledger.owners == {1: 2}


def test_a_claimant_seen_by_the_binding_is_dropped_alone_and_the_owner_kept() -> None:
    ledger = Ownership()
    assert bind_by_claims(_claims(n1=0, n2=1, n5=4), ledger, ALL) == {}
    for claims in (_claims(n1=0, n5=0), _claims(n5=0)):  # the owner replying too, or not
        dropped = bind_by_claims(claims, ledger, ALL)
        assert dropped == {5: "partition-id=0 belongs to node 1, which held it first"}
    # seen in round 1 without a claim of 0 (claimed nothing): it had its chance too
    ledger = Ownership()
    bind_by_claims({**_claims(n1=0), 3: {}}, ledger, ALL)
    assert bind_by_claims(_claims(n3=0), ledger, ALL) == {
        3: "partition-id=0 belongs to node 1, which held it first"}
    assert ledger.owners == {0: 1} and not ledger.quarantined


def test_a_node_holding_an_id_cannot_claim_a_second_nor_an_unbound_one() -> None:
    ledger = Ownership()
    bind_by_claims(_claims(n1=0, n2=1), ledger, ALL)
    assert bind_by_claims(_claims(n2=3), ledger, ALL) == {2: "partition-id=3: node 2 holds 1"}
    assert ledger.owners == {0: 1, 1: 2}


def test_two_first_claims_in_one_round_quarantine_the_id() -> None:
    strategy = _strategy("fedavg")
    replies = {n: _honest(strategy, n) for n in ALL}
    replies[HOSTILE]["metrics"][wire.PARTITION_ID] = 0  # node 1's partition, in the first round
    _round(strategy, replies)
    assert set(strategy.report.rejected) == {"1", "5"} and strategy.report.accepted == 3
    assert "partition-id=0 is quarantined: claimed by nodes 1, 5" in strategy.report.rejected["5"]
    assert strategy.state.partition_owners == {1: 2, 2: 3, 3: 4}
    # a quarantined claimant cannot move to a free id either
    replies = {n: _honest(strategy, n) for n in ALL}
    replies[HOSTILE]["metrics"][wire.PARTITION_ID] = 4
    _round(strategy, replies)
    assert strategy.report.rejected["5"] == "partition-id=4: node 5 claimed quarantined partition-id=0"


def test_an_owner_that_left_frees_its_id() -> None:
    ledger = Ownership()
    bind_by_claims(_claims(n1=0), ledger, ALL)
    assert bind_by_claims(_claims(n5=0), ledger, connected=[2, 3, 4, 5]) == {}  # node 1 gone
    assert ledger.owners == {0: 5}


def test_the_partition_map_is_the_binding() -> None:
    mapping = {1: 0, 2: 1, 5: 4}
    ledger = Ownership(quarantined={0: [1, 5]})  # a map resolves a quarantine
    dropped = bind_by_map({**_claims(n1=0, n2=1, n5=0), 3: {}}, mapping, ledger)
    assert dropped == {5: "partition-id=0: partition-map gives node 5 partition-id=4",
                       3: "node 3 is not in partition-map"}
    assert ledger.owners == {0: 1, 1: 2, 4: 5} and not ledger.quarantined


def test_a_thief_under_a_partition_map_is_dropped_from_its_first_claim() -> None:
    strategy = _strategy("fedavg", partition_map="1:0, 2:1, 3:2, 4:3, 5:4")
    replies = {n: _honest(strategy, n) for n in (2, 3, HOSTILE)}
    replies[HOSTILE]["metrics"][wire.PARTITION_ID] = 0
    _round(strategy, replies)
    assert strategy.report.rejected == {"5": "partition-id=0: partition-map gives node 5 partition-id=4"}
    _round(strategy, {n: _honest(strategy, n) for n in ALL})
    assert strategy.report.rejected == {} and strategy.report.accepted == 5


def test_the_ledger_is_checkpointed_and_resumed() -> None:
    strategy = _strategy("fedavg")
    replies = {n: _honest(strategy, n) for n in (2, HOSTILE)}
    replies[HOSTILE]["metrics"][wire.PARTITION_ID] = 0
    _round(strategy, replies)
    resumed = _strategy("fedavg")
    resumed.state = ServerState.from_bytes(strategy.state.to_bytes())
    assert resumed.state.ownership == strategy.state.ownership
    assert resumed.state.ownership.as_dict() == {"owners": {0: 5, 1: 2}, "bound_at": {0: 1, 1: 1},
                                                 "first_seen": {2: 1, 5: 1}, "quarantined": {},
                                                 "rounds": 1}
    _round(resumed, {1: _honest(resumed, 1), 2: _honest(resumed, 2)})  # the owner comes
    assert "partition-id=0 is quarantined" in resumed.report.rejected["1"]
    assert ServerState.from_bytes(resumed.state.to_bytes()).ownership.quarantined == {0: [1, 5]}


def test_a_checkpoint_from_before_the_ledger_keeps_its_owners() -> None:
    legacy = Ownership.from_dict({}, {0: 1, 1: 2})
    assert legacy.owners == {0: 1, 1: 2} and legacy.bound_at == {}
    assert bind_by_claims(_claims(n1=0, n2=1), legacy, ALL) == {}


@pytest.mark.parametrize("text,match", [
    ("1:0,2", "'2' is not node-id:partition-id"), ("a:1", "'a:1' is not node-id:partition-id"),
    ("1:-1", "'1:-1' is not"), ("1:0,1:1", "node 1 is listed twice"),
    ("1:0,2:0", "partition-id 0 is given to two nodes"),
])
def test_a_malformed_partition_map_is_refused_in_one_line(text: str, match: str) -> None:
    with pytest.raises(ValueError, match=match) as refused:
        RunConfig.of(partition_map=text)
    assert "\n" not in str(refused.value) and str(refused.value).startswith("invalid partition-map")
    assert RunConfig.from_flower({"partition-map": "11:0,12:1"}).federation.partition_map == "11:0,12:1"


def test_a_skipped_round_leaves_the_ledger_as_it_was() -> None:
    """The ledger is committed with the round's state: a round that is skipped (here every reply
    dropped) leaves the ledger as the last good round left it, as every part of the state."""
    strategy = _strategy("fedavg")
    replies = {n: _honest(strategy, n) for n in (2, HOSTILE)}
    replies[HOSTILE]["metrics"][wire.PARTITION_ID] = 0
    _round(strategy, replies)
    before = strategy.state.ownership.clone()
    _round(strategy, {1: _honest(strategy, 1)})  # dropped (quarantine): 0 accepted, skipped
    assert strategy.report.skipped and strategy.state.ownership == before


def test_a_resume_may_add_the_partition_map_that_resolves_a_quarantine(tmp_path) -> None:
    (tmp_path / CONFIG_FILE).write_text(json.dumps(RunConfig.of().to_flower()))
    check_same_job(RunConfig.of(partition_map="1:0,2:1"), tmp_path)  # no error: may change
    with pytest.raises(ValueError, match="run config differs"):
        check_same_job(RunConfig.of(seed=7), tmp_path)
