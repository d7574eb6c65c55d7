"""What a node holds the server to in a SecAgg+ round, beyond each stage's own checks
(secagg/client.py): one setup per round, and the masked vector's layout exactly the contract's.

    one masked input      a node sends its masked input once for a round of a run, and sets
      per round           up no round again once it has: a second would let the server unmask
                          a second, independently noised sum of the same updates. A setup again
                          before that is the same round restarted without the node the blame
                          removed (secagg/blame.py: nothing was masked yet). Kept in
                          `context.state` (the rounds masked); the training the masked input
                          runs is booked in the node's own ledger (privacy/node_ledger.py),
                          which a restart keeps
    the exact layout      the layout the server sends names each shared record's arrays once,
                          in the contract's order (Δ, the uploads, the averaged metrics as one
                          value each: privacy/mechanism.py `shared_records`), the arrays of a
                          record by name; the shapes are the node's own arrays'. A layout that
                          repeats an entry would have the node add fresh noise to each copy, and
                          the server's mean of the copies would carry less than the node's floor
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from flwr.app import ConfigRecord, Context

from adaptfl.algorithms.recipe import algorithm_from_recipe
from adaptfl.core import wire
from adaptfl.secagg.fixedpoint import METRIC

ROUNDS = "adaptfl-secagg-rounds"  # context.state ConfigRecord: {run id: [rounds masked]}


def _masked_rounds(context: Context) -> tuple[ConfigRecord, list[int]]:
    record = context.state.config_records.get(ROUNDS)
    if record is None:
        record = context.state[ROUNDS] = ConfigRecord()
    return record, [int(r) for r in record.get(str(context.run_id), [])]  # type: ignore[union-attr]


def _refuse_if_masked(done: list[int], server_round: int) -> None:
    if server_round in done:
        raise ValueError(f"secagg: round {server_round} was masked already; a node sends one masked "
                         "input per round (a second would release a second noised sum)")


def check_first_setup(context: Context, server_round: int) -> None:
    """Refuse (ValueError, one line) a setup for a round whose masked input this node sent."""
    _refuse_if_masked(_masked_rounds(context)[1], server_round)


def note_masked(context: Context, server_round: int) -> None:
    """Refuse a second masked input for a round of this run; note this one (before it trains)."""
    record, done = _masked_rounds(context)
    _refuse_if_masked(done, server_round)
    record[str(context.run_id)] = [*done, server_round]


def contract_layout(recipe: ConfigRecord, records: Mapping[str, Mapping[str, torch.Tensor]]
                    ) -> list[str] | None:
    """The layout this node expects: `shared_records`'s order (Δ, the uploads in the stages'
    order, the averaged metrics sorted), each record's arrays sorted by name, as
    fixedpoint.layout writes it on the server. None for a recipe without an algorithm (a
    stand-in for training; adaptfl's own ClientApp refuses such a recipe before it trains)."""
    if "algorithm" not in recipe:
        return None
    algorithm = algorithm_from_recipe(recipe)
    stages = algorithm.stages()
    uploads = [wire.DELTA, *(r.name for s in stages for r in s.records_up())]
    metrics = sorted({m.name for s in stages for m in s.up_metrics})
    entries = [f"{record}/{name}" for record in uploads for name in sorted(records.get(record, {}))]
    return entries + [f"{m}/{METRIC}" for m in metrics]


def check_layout(names: list[str], expected: list[str] | None) -> None:
    """The server's layout must be `expected`, entry for entry, or (None) list each entry once
    (ValueError, one line)."""
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        why = f"lists {repeated[:3]} more than once"
    elif expected is None or names == expected:
        return
    elif sorted(names) == sorted(expected):
        why = "lists the contract's entries in another order"
    else:
        missing, extra = sorted(set(expected) - set(names)), sorted(set(names) - set(expected))
        why = f"lacks {missing[:3]}" if missing else f"names {extra[:3]}, which the contract lacks"
        if missing and extra:
            why += f" and names {extra[:3]}"
    raise ValueError(f"secagg: the layout {why}; only the round's contract is answered"
                     + (f" ({len(expected)} entries)" if expected is not None else ""))
