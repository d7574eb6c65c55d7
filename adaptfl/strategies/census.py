"""HaFedHo's |D| from every node before round 1 (seed 003, Algorithm 1: p_i = |D_i| / |D|, |D|
over the whole federation), where the server does not hold the partitioning (a deployment).

Before a round's training the server sends each connected node it has not asked yet one small
QUERY message (the round's recipe, no model) and each answers `num-examples` and its
`partition-id` (client_app/app.py `handle_census`). Each valid first claim of a partition id
goes into the claims ledger (examples.py `LEDGER`), where every claim is capped at
max-weight-ratio × the median claim: so from round 1 |D| is Σ_i min(n_i, r · median n) over
every node, and no claim, made first or not, can set it. A reply that failed, came from a node
not asked, names no partition id, claims no count >= 1, or claims a partition id another reply
of the same census claims, is dropped alone with its reason (logged); the round goes on. A
node that does not answer (a ClientApp of your own without `@app.query`) is counted as before:
at the median claim until its first training reply.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping

import torch
from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from adaptfl.core import wire
from adaptfl.strategies.examples import LEDGER, ledger_of, ledger_record

log = logging.getLogger("adaptfl.strategies.base")  # the strategy's logger


def census_messages(nodes: Iterable[int], recipe: ConfigRecord) -> list[Message]:
    return [Message(content=RecordDict({wire.RECIPE: recipe}), dst_node_id=node,
                    message_type=MessageType.QUERY) for node in sorted(nodes)]


def claim_of(msg: Message) -> tuple[int, float]:
    """(partition id, num-examples) of one census reply; ValueError saying why it is not one."""
    if msg.has_error():
        last = ((msg.error.reason or "").strip().splitlines() or ["no reason given"])[-1]
        raise ValueError(f"the client failed: {last}")
    record = msg.content.metric_records.get(wire.METRICS)
    if record is None:
        raise ValueError(f"no {wire.METRICS!r} record")
    pid, examples = record.get(wire.PARTITION_ID), record.get(wire.NUM_EXAMPLES)
    if not isinstance(pid, int) or isinstance(pid, bool) or pid < 0:
        raise ValueError(f"{wire.PARTITION_ID}={pid!r}: a partition id >= 0 is required")
    if not isinstance(examples, int | float) or not math.isfinite(examples) or examples < 1:
        raise ValueError(f"{wire.NUM_EXAMPLES}={examples!r}: a count >= 1 is required")
    return pid, float(examples)


def read_census(replies: Iterable[Message], asked: set[int]) -> tuple[dict[int, float], dict[str, str]]:
    """({partition id: claim}, {node: why dropped}): one claim per asked node; a partition id
    claimed twice in one census is dropped for every claimant (neither can be told honest)."""
    claims: dict[int, tuple[int, float]] = {}  # node -> (pid, claim)
    dropped: dict[str, str] = {}
    for msg in replies:
        node = msg.metadata.src_node_id
        if node not in asked or node in claims or str(node) in dropped:
            dropped[str(node)] = "a census reply from a node not asked, or a second one"
            claims.pop(node, None)
            continue
        try:
            claims[node] = claim_of(msg)
        except ValueError as why:
            dropped[str(node)] = str(why)
    owners: dict[int, list[int]] = {}
    for node, (pid, _) in claims.items():
        owners.setdefault(pid, []).append(node)
    for pid, nodes in owners.items():
        if len(nodes) > 1:
            shared = f"{wire.PARTITION_ID}={pid} claimed by nodes {sorted(nodes)}"
            dropped.update({str(n): shared for n in nodes})
    return {pid: c for node, (pid, c) in claims.items() if len(owners[pid]) == 1}, dropped


def take_census(grid: Grid, nodes: Iterable[int], asked: set[int], recipe: ConfigRecord,
                extras: dict[str, dict[str, torch.Tensor]], timeout: float | None) -> dict[str, str]:
    """Ask the nodes not in `asked` (updated) for their examples; their first claims into the
    ledger in `extras` (a claim of an id already in it changes nothing: examples.py). The
    replies dropped, by node, with why."""
    new = set(nodes) - asked
    if not new:
        return {}
    asked |= new
    claims, dropped = read_census(grid.send_and_receive(census_messages(new, recipe), timeout=timeout), new)
    ledger: Mapping[int, float] = ledger_of(extras)
    merged = {**claims, **ledger}  # first claims kept
    if merged:
        extras[LEDGER] = ledger_record(merged)
    for node, why in sorted(dropped.items()):
        log.warning("census reply from node %s dropped: %s", node, why)
    return dropped
