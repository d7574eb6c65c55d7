"""Which node a partition id belongs to (docs/robustness.md, "Partition ownership"). A reply's
partition id is the one thing in it the client asserts about who it is; the node it came from
is Flower's (the SuperLink authenticates the connection, intake checks the reply answers that
node's instruction). So a binding may rest on node ids and on the order the server saw them,
never on who claimed first:

- `partition-map` given (run config): it is the binding. A listed node may claim its own id only;
  a node not listed is dropped.
- no map: an id binds to the node that claimed it alone in a round. A later claim by another
  node drops the claimant alone if the server had seen that node by the round of the binding
  (it had its chance to claim the id then, and claimed another or none), or if it holds an id of
  its own. A claimant first seen only after the binding may be the true owner, raced by a liar
  while it was not sampled: the id is then quarantined (every claimant dropped, every round,
  each with the reason) until a `partition-map` names its owner; so is an id two nodes claim in
  one round. A liar can thus deny one partition, never take it from its owner silently.

An owner that is no longer connected frees its id (a restarted SuperNode gets a new node id);
a quarantine is kept for the run. All of it is in the server state (checkpointed, resumed),
committed with the round: a skipped or refused round leaves it as it was.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from adaptfl.core import wire

PID = wire.PARTITION_ID


@dataclass
class Ownership:
    owners: dict[int, int] = field(default_factory=dict)  # partition id -> node
    bound_at: dict[int, int] = field(default_factory=dict)  # partition id -> round it was bound
    first_seen: dict[int, int] = field(default_factory=dict)  # node -> round of its first reply
    quarantined: dict[int, list[int]] = field(default_factory=dict)  # id -> its claimants
    rounds: int = 0  # rounds of replies seen (skipped ones too): the clock of the fields above

    def as_dict(self) -> dict[str, object]:
        """Plain ints and lists, for the checkpoint (torch.load weights_only)."""
        return {"owners": dict(self.owners), "bound_at": dict(self.bound_at),
                "first_seen": dict(self.first_seen),
                "quarantined": {p: list(n) for p, n in self.quarantined.items()}, "rounds": self.rounds}

    @classmethod
    def from_dict(cls, raw: Mapping[str, object], legacy_owners: Mapping[int, int]) -> Ownership:
        """`legacy_owners`: a checkpoint's partition_owners from before this ledger (bound at 0)."""
        def ints(key: str) -> dict[int, int]:
            return {int(k): int(v) for k, v in dict(raw.get(key, {})).items()}  # type: ignore[call-overload]
        if not raw:
            return cls(owners={int(p): int(n) for p, n in legacy_owners.items()})
        quarantined = {int(p): [int(n) for n in nodes]
                       for p, nodes in dict(raw.get("quarantined", {})).items()}  # type: ignore[call-overload]
        return cls(ints("owners"), ints("bound_at"), ints("first_seen"), quarantined,
                   int(raw.get("rounds", 0)))  # type: ignore[call-overload]

    def clone(self) -> Ownership:
        return Ownership.from_dict(self.as_dict(), {})


def claims_of(replies: Mapping[int, Mapping[str, object]]) -> dict[int, list[int]]:
    """partition id -> the nodes claiming it, from each node's reply metrics."""
    claims: dict[int, list[int]] = {}
    for node, metrics in sorted(replies.items()):
        if PID in metrics:
            claims.setdefault(int(metrics[PID]), []).append(node)  # type: ignore[call-overload]
    return claims


def bind_by_map(replies: Mapping[int, Mapping[str, object]], mapping: Mapping[int, int],
                ledger: Ownership) -> dict[int, str]:
    """node -> why dropped, under an operator's map (node -> partition id), which becomes the
    ledger's binding (and resolves its quarantines)."""
    ledger.rounds += 1
    ledger.owners = {pid: node for node, pid in mapping.items()}
    ledger.quarantined = {}
    dropped: dict[int, str] = {}
    for node, metrics in replies.items():
        if node not in mapping:
            dropped[node] = f"node {node} is not in partition-map"
        elif PID in metrics and int(metrics[PID]) != mapping[node]:  # type: ignore[call-overload]
            dropped[node] = (f"{PID}={metrics[PID]}: partition-map gives node {node} "
                             f"{PID}={mapping[node]}")
    return dropped


def bind_by_claims(replies: Mapping[int, Mapping[str, object]], ledger: Ownership,
                   connected: Collection[int]) -> dict[int, str]:
    """node -> why dropped, for the round's claims without a map (the rule in the module doc);
    updates `ledger`."""
    ledger.rounds += 1
    for pid in [p for p, n in ledger.owners.items() if n not in connected]:  # a node that left
        del ledger.owners[pid]
        ledger.bound_at.pop(pid, None)
    for node in replies:
        ledger.first_seen.setdefault(node, ledger.rounds)
    dropped: dict[int, str] = {}
    for pid, nodes in sorted(claims_of(replies).items()):
        _decide(ledger, pid, _unproven(ledger, pid, nodes, dropped), dropped)
    return dropped


def _unproven(ledger: Ownership, pid: int, nodes: list[int], dropped: dict[int, str]) -> list[int]:
    """The claimants of `pid` whose claim no earlier fact refutes; the others into `dropped`."""
    owner = ledger.owners.get(pid)
    held = {n: p for p, n in ledger.owners.items()}
    suspects = {n: p for p, claimants in ledger.quarantined.items() for n in claimants}
    free = []
    for node in nodes:
        if node == owner:
            free.append(node)
        elif owner is not None and (node in held or ledger.first_seen[node] <= ledger.bound_at[pid]):
            # it holds an id of its own, or was seen by the binding and claimed another then
            dropped[node] = f"{PID}={pid} belongs to node {owner}, which held it first"
        elif held.get(node, pid) != pid:
            dropped[node] = f"{PID}={pid}: node {node} holds {held[node]}"
        elif suspects.get(node, pid) != pid:
            dropped[node] = f"{PID}={pid}: node {node} claimed quarantined {PID}={suspects[node]}"
        else:
            free.append(node)
    return free


def _decide(ledger: Ownership, pid: int, free: list[int], dropped: dict[int, str]) -> None:
    """Binds `pid` to a lone first claimant, or quarantines it where the claims are ambiguous."""
    owner = ledger.owners.get(pid)
    late = [n for n in free if n != owner]
    if pid in ledger.quarantined:
        _quarantine(ledger, pid, free, free, dropped)
    elif owner is None and len(free) == 1:
        ledger.owners[pid], ledger.bound_at[pid] = free[0], ledger.rounds
    elif owner is None and free:  # two first claims in one round: nothing tells the owner's
        _quarantine(ledger, pid, free, free, dropped)
    elif owner is not None and late:  # first seen after the binding: maybe the owner that a
        del ledger.owners[pid], ledger.bound_at[pid]  # liar raced while it was not sampled
        _quarantine(ledger, pid, [owner, *late], free, dropped,
                    f"; node {owner} held it before nodes {_names(late)} were first seen")


def _names(nodes: Collection[int]) -> str:
    return ", ".join(map(str, sorted(nodes)))


def _quarantine(ledger: Ownership, pid: int, claimants: list[int], present: list[int],
                dropped: dict[int, str], note: str = "") -> None:
    """Adds `claimants` to `pid`'s and drops those of them that replied this round (`present`)."""
    ledger.quarantined[pid] = sorted({*ledger.quarantined.get(pid, []), *claimants})
    why = (f"{PID}={pid} is quarantined: claimed by nodes {_names(ledger.quarantined[pid])}{note}; "
           "partition-map must name its owner")
    for node in present:
        dropped[node] = why
