"""The federation's examples counted once from the clients' claims (strategies/examples.py):
HaFedHo's |D| where the server does not hold the partitioning. Hand-computed oracles."""

from __future__ import annotations

import torch

from adaptfl.core import wire
from adaptfl.strategies.examples import (
    LEDGER,
    counted_once,
    federation_examples,
    ledger_of,
    ledger_record,
    round_examples,
)
from adaptfl.strategies.state import ServerState


def _claim(pid: int, n: float) -> dict[str, float | int]:
    return {wire.PARTITION_ID: pid, wire.NUM_EXAMPLES: n}


def test_each_client_counts_once_with_its_first_claim() -> None:
    ledger = counted_once({}, [_claim(0, 100), _claim(1, 300)])
    assert ledger == {0: 100.0, 1: 300.0}
    # round 2: partition 1 now claims 9000 (counted already: unchanged), partition 2 is new
    assert counted_once(ledger, [_claim(1, 9000), _claim(2, 200)]) == {0: 100.0, 1: 300.0, 2: 200.0}
    # a reply without a partition id adds nothing (it cannot be counted once); the round goes
    # on with the ledger; only where nothing at all names a partition is there no count
    assert counted_once(ledger, [{wire.NUM_EXAMPLES: 5}, _claim(3, 50)]) == {**ledger, 3: 50.0}
    assert counted_once({}, [{wire.NUM_EXAMPLES: 5}]) is None


def test_unseen_clients_count_at_the_median_and_a_liar_at_the_cap() -> None:
    # 2 of 4 seen, 100 and 300: median 200, the 2 unseen at 200 each: 100 + 300 + 400
    assert federation_examples({0: 100.0, 1: 300.0}, 4, 10.0) == 800.0
    # every client seen: the claims summed, the paper's |D|
    assert federation_examples({0: 100.0, 1: 300.0, 2: 200.0, 3: 250.0}, 4, 10.0) == 850.0
    # a liar's 2**62 (recorded first) capped at 10 × the median (200 + 300) / 2 once the others
    # are seen
    assert federation_examples({0: 2.0**62, 1: 100.0, 2: 200.0, 3: 300.0}, 4, 10.0) == 2500 + 600
    assert federation_examples({0: 2.0**62, 1: 100.0, 2: 200.0, 3: 300.0}, 4, 0.0) >= 2.0**62  # uncapped
    # more partitions than nodes (several clients a node): nothing extrapolated below zero
    assert federation_examples({0: 1.0, 1: 2.0, 2: 3.0}, 2, 10.0) == 6.0
    assert federation_examples({}, 4, 10.0) == 0.0


def test_the_server_holding_the_partitioning_or_no_stage_counting_keeps_no_ledger() -> None:
    claims = [_claim(0, 100), _claim(1, 300)]
    assert round_examples({}, claims, [10, 20, 30], True, 3, 10.0) == (60.0, None)
    assert round_examples({}, claims, None, False, 3, 10.0) == (0.0, None)
    assert round_examples({}, [{wire.NUM_EXAMPLES: 5}], None, True, 3, 10.0) == (0.0, None)
    assert round_examples({}, claims, None, True, 3, 10.0) == (600.0, {0: 100.0, 1: 300.0})


def test_the_ledger_survives_the_checkpoint() -> None:
    ledger = {2**40: 7.0, 3: 2.0**62}  # ids and claims beyond float32's and int32's exact range
    state = ServerState(server_round=2, model={"w": torch.zeros(1)}, extras={LEDGER: ledger_record(ledger)})
    assert ledger_of(ServerState.from_bytes(state.to_bytes()).extras) == ledger
