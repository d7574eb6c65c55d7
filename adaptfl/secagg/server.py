"""The server's side of SecAgg+ (protocol.py): one round's four exchanges over a Flower Grid,
and the unmasked sum. A node that errs, is late or answers out of contract drops out (with its
reason); the round goes on while every secret it needs has t shares, and otherwise ends with a
reason and no sum (SecureRefused): never a wrong sum. A sum that no inputs in range could have
made (fixedpoint.beyond_reach) is refused too.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from adaptfl.core import wire
from adaptfl.secagg import crypto, fixedpoint
from adaptfl.secagg import protocol as p


class SecureRefused(RuntimeError):
    """The round cannot be unmasked (too few shares, too few nodes): the message says why."""


@dataclass
class SecureRound:
    """What one SecAgg+ round gives the strategy."""

    total: np.ndarray | None = None  # the live nodes' summed integers (int64), None if refused
    live: list[int] = field(default_factory=list)  # nodes whose masked input is in the sum
    metrics: dict[int, dict] = field(default_factory=dict)  # each live node's plain metrics
    dropped: dict[int, str] = field(default_factory=dict)  # node -> why it left the round
    bytes_down: int = 0
    bytes_up: int = 0
    latency: dict[int, float] = field(default_factory=dict)


def content_bytes(content: RecordDict) -> int:
    """A message's payload bytes: its arrays' serialised bytes and its config values' bytes."""
    total = sum(len(a.data) for rec in content.array_records.values() for a in rec.values())
    for rec in content.config_records.values():
        for value in rec.values():
            items = value if isinstance(value, list) else [value]
            total += sum(len(v) if isinstance(v, bytes | str) else 8 for v in items)
    return total


class SecAggServer:
    """Runs one round: `run(grid, nodes, instruction, layout)` with a `send(messages)` of the grid."""

    def __init__(self, shares: int, threshold: int, bits: int, bound: int, noise_std: float,
                 timeout: float | None, seed: int, server_round: int) -> None:
        self.shares, self.threshold, self.bits, self.bound = shares, threshold, bits, bound
        self.noise_std, self.timeout, self.round = noise_std, timeout, server_round
        self.seed = seed
        self.out = SecureRound()
        # the round's state, stage by stage
        self.neighbours: dict[int, set[int]] = {}
        self.keys: dict[int, tuple[bytes, bytes]] = {}  # node -> (encryption, mask) public keys
        self.sealed: dict[int, dict[int, bytes]] = {}
        self.commits: dict[int, bytes] = {}
        self.masked: dict[int, np.ndarray] = {}
        self.length = 0

    # --- the exchanges ---------------------------------------------------------------------------
    def _exchange(self, grid: Grid, contents: dict[int, RecordDict], stage: str
                  ) -> dict[int, RecordDict]:
        """Send each node its content; the valid-looking replies by node (the rest dropped)."""
        messages = [Message(content=c, dst_node_id=node, message_type=MessageType.TRAIN)
                    for node, c in contents.items()]
        self.out.bytes_down += sum(content_bytes(c) for c in contents.values())
        node_of = {m.metadata.message_id: m.metadata.dst_node_id for m in messages if m.metadata.message_id}
        got: dict[int, RecordDict] = {}
        for reply in grid.send_and_receive(messages, timeout=self.timeout):
            node = node_of.get(reply.metadata.reply_to_message_id, reply.metadata.src_node_id)
            if node not in contents or node in got or node in self.out.dropped:
                if node in got:  # two replies: neither counts
                    self._drop(node, f"{stage}: two replies", got)
                continue
            if reply.has_error():
                self._drop(node, f"{stage}: {reply.error.reason}", got)
                continue
            got[node] = reply.content
            self.out.bytes_up += content_bytes(reply.content)
        for node in contents:
            if node not in got and node not in self.out.dropped:
                self.out.dropped[node] = f"{stage}: no reply"
        return got

    def _drop(self, node: int, why: str, got: dict[int, RecordDict] | None = None) -> None:
        self.out.dropped.setdefault(node, why)
        if got is not None:
            got.pop(node, None)

    def _config(self, stage: str, values: dict[str, Any]) -> RecordDict:
        return RecordDict({wire.SECAGG: ConfigRecord({p.STAGE: stage, p.ROUND: self.round, **values})})

    def _prune(self, alive: set[int], stage: str) -> set[int]:
        """Drop nodes left with fewer than t - 1 live neighbours (their secrets could not be
        rebuilt), until none is; refuse the round below 3 nodes (a sum of two is each one's)."""
        changed = True
        while changed:
            changed = False
            for node in sorted(alive):
                if len(self.neighbours[node] & alive) + 1 < self.threshold:
                    alive.discard(node)
                    self.out.dropped.setdefault(node, f"{stage}: fewer than {self.threshold - 1} live "
                                                "neighbours")
                    changed = True
        if len(alive) < 3:
            raise SecureRefused(f"secagg+: {len(alive)} nodes left after {stage}; a sum needs 3 or more")
        return alive

    def run(self, grid: Grid, nodes: list[int], instruction: RecordDict, layout: list[fixedpoint.Slot],
            clips: dict[str, float], admit: Admit | None = None) -> SecureRound:
        """The round's sum, one function per stage of protocol.py's table; `admit(metrics by
        node)` names the masked replies to drop (their plain metrics checked, partitions bound)
        before anything is unmasked."""
        if len(nodes) < 3:
            raise SecureRefused(f"secagg+: {len(nodes)} sampled nodes; a sum needs 3 or more")
        self.neighbours = p.ring_neighbours(nodes, self.shares, self.seed)
        alive = self._setup(grid, nodes)
        alive = self._share_keys(grid, alive)
        live = self._masked_input(grid, alive, instruction, layout, clips, admit)
        total = fixedpoint.from_ring(self._unmask(grid, live, alive - live), self.bits)
        why = fixedpoint.beyond_reach(total, layout, self.bound, len(live), self.noise_std)
        if why:  # what no len(live) inputs in range reach: a node lied about its input
            raise SecureRefused(why)
        self.out.total, self.out.live = total, sorted(live)
        return self.out

    # --- the stages ------------------------------------------------------------------------------
    def _setup(self, grid: Grid, nodes: list[int]) -> set[int]:
        """Fresh keys. Drops: no reply, an error, keys that are not X25519 keys."""
        replies = self._exchange(grid, {n: self._config(p.SETUP, {
            p.SHARES: self.shares, p.THRESHOLD: self.threshold,
            p.NEIGHBOURS: sorted(self.neighbours[n])}) for n in nodes}, p.SETUP)
        self.keys = {}
        for node, content in replies.items():
            rec = content.config_records.get(wire.SECAGG, ConfigRecord())
            try:
                pair = (bytes(rec[p.PK_ENC]), bytes(rec[p.PK_MASK]))  # type: ignore[arg-type]
                crypto.public_key(pair[0]), crypto.public_key(pair[1])
            except (KeyError, TypeError, ValueError):
                self._drop(node, "setup: no valid public keys")
                continue
            self.keys[node] = pair
        return self._prune(set(self.keys), p.SETUP)

    def _share_keys(self, grid: Grid, alive: set[int]) -> set[int]:
        """The encrypted shares and the commitment to b. Drops: not one ciphertext per live
        neighbour and a commitment."""
        replies = self._exchange(grid, {n: self._config(p.SHARE_KEYS, {
            **{f"{p.PK_ENC}:{j}": self.keys[j][0] for j in self.neighbours[n] & alive},
            **{f"{p.PK_MASK}:{j}": self.keys[j][1] for j in self.neighbours[n] & alive}})
            for n in sorted(alive)}, p.SHARE_KEYS)
        self.sealed, self.commits = {}, {}  # sender -> receiver -> ciphertext; sender -> H(b)
        for node, content in replies.items():
            rec = content.config_records.get(wire.SECAGG, ConfigRecord())
            expected = {p.key_of(j) for j in self.neighbours[node] & alive} | {p.COMMIT}
            if set(rec) != expected or not all(isinstance(v, bytes) for v in rec.values()):
                self._drop(node, "share-keys: not one encrypted share per live neighbour and a commitment")
                continue
            self.commits[node] = bytes(rec[p.COMMIT])  # type: ignore[arg-type]
            self.sealed[node] = {int(k): bytes(v) for k, v in rec.items() if k != p.COMMIT}  # type: ignore[arg-type]
        return self._prune(set(self.sealed), p.SHARE_KEYS)  # U2: their masks are in their peers' y

    def _masked_input(self, grid: Grid, alive: set[int], instruction: RecordDict,
                      layout: list[fixedpoint.Slot], clips: dict[str, float], admit: Admit | None
                      ) -> set[int]:
        """y with the training instruction. Drops: a malformed y, no metrics, a reply `admit`
        refuses (before anything is unmasked: a reply refused afterwards stays in the sum)."""
        setup: dict[str, Any] = {p.BITS: self.bits, p.BOUND: self.bound, p.NOISE_STD: self.noise_std,
                                 p.SEED: self.seed, p.LAYOUT: [f"{s.record}/{s.name}" for s in layout],
                                 **{f"clip:{r}": c for r, c in clips.items()}}
        contents = {}
        for n in sorted(alive):
            content = RecordDict(dict(instruction))
            content[wire.SECAGG] = ConfigRecord({
                p.STAGE: p.MASKED_INPUT, p.ROUND: self.round, **setup,
                **{f"ct:{j}": self.sealed[j][n] for j in self.neighbours[n] & alive}})
            contents[n] = content
        replies = self._exchange(grid, contents, p.MASKED_INPUT)
        self.length, self.masked = fixedpoint.length(layout), {}
        for node, content in replies.items():
            why = self._check_masked(content, self.length)
            if why:
                self._drop(node, f"masked-input: {why}")
                continue
            self.masked[node] = content.array_records[wire.MASKED][p.MASKED_ARRAY].numpy().astype(np.uint64)
            self.out.metrics[node] = dict(content.metric_records[wire.METRICS])
        for node, why in (admit(self.out.metrics) if admit is not None else {}).items():
            self._drop(node, f"masked-input: {why}")
            self.masked.pop(node, None)
        live = self._prune(set(self.masked), p.MASKED_INPUT)
        self.out.metrics = {n: m for n, m in self.out.metrics.items() if n in live}
        return live

    def _unmask(self, grid: Grid, live: set[int], dead: set[int]) -> np.ndarray:
        """Each live node's b and each dead node's mask key from t shares, checked against their
        commitments; the masks removed. Refused: fewer than t shares, a secret that fails its
        commitment (never a wrong sum)."""
        replies = self._exchange(grid, {n: self._config(p.UNMASK, {
            p.ACTIVE: sorted((self.neighbours[n] & live) | {n}),
            p.DEAD: sorted(self.neighbours[n] & dead)}) for n in sorted(live)}, p.UNMASK)
        b_shares, s_shares = self._shares_of(replies, live, dead)
        total = np.zeros(self.length, dtype=np.uint64)
        for node in sorted(live):
            total += self.masked[node]
        for node in sorted(live):  # remove each live node's self mask
            seed = self._rebuild(b_shares[node], node, "self-mask seed")
            if crypto.commitment(seed) != self.commits[node]:  # a spoiled share: refuse, never a wrong sum
                raise SecureRefused(f"secagg+: node {node}'s self-mask seed does not match its commitment")
            p.add_mask(total, crypto.self_mask_key(seed), -1, self.bits)
        for node in sorted(dead):  # and the masks live peers shared with a node that vanished
            peers = self.neighbours[node] & live
            if not peers:
                continue
            secret = crypto.KeyPair.from_seed(self._rebuild(s_shares[node], node, "mask key"))
            if secret.public != self.keys[node][1]:  # its public key is the mask seed's commitment
                raise SecureRefused(f"secagg+: node {node}'s mask key does not match its public key")
            for peer in sorted(peers):
                p.add_mask(total, secret.agree(self.keys[peer][1]), -p.pair_sign(peer, node), self.bits)
        return total

    def _shares_of(self, replies: dict[int, RecordDict], live: set[int], dead: set[int]
                   ) -> tuple[dict[int, list[bytes]], dict[int, list[bytes]]]:
        """(b-shares of each live node, mask-key shares of each dead one): a node's answer counts
        only for itself and its neighbours."""
        b_shares: dict[int, list[bytes]] = {n: [] for n in live}
        s_shares: dict[int, list[bytes]] = {n: [] for n in dead}
        for node, content in replies.items():
            rec = content.config_records.get(wire.SECAGG, ConfigRecord())
            for k, v in rec.items():
                kind, _, of = k.partition(":")
                target = b_shares if kind == "b" else s_shares if kind == "s" else None
                holds = of.isdigit() and (int(of) == node or int(of) in self.neighbours[node])
                if target is not None and holds and int(of) in target and isinstance(v, bytes):
                    target[int(of)].append(v)
        return b_shares, s_shares

    def _check_masked(self, content: RecordDict, length: int) -> str:
        arrays = content.array_records
        if set(arrays) != {wire.MASKED} or set(arrays[wire.MASKED]) != {p.MASKED_ARRAY}:
            return f"records {sorted(arrays)}, not one {wire.MASKED!r} array"
        arr = arrays[wire.MASKED][p.MASKED_ARRAY]
        if tuple(arr.shape) != (length,) or arr.dtype != np.dtype(fixedpoint.wire_dtype(self.bits)).name:
            return f"masked array of shape {tuple(arr.shape)} / {arr.dtype}, not ({length},)"
        if wire.METRICS not in content.metric_records:
            return "no metrics"
        return ""

    def _rebuild(self, shares: list[bytes], node: int, what: str) -> bytes:
        if len(shares) < self.threshold:
            raise SecureRefused(f"secagg+: node {node}'s {what} has {len(shares)} of the "
                                f"{self.threshold} shares it needs; the round is not unmasked")
        try:  # checked by the caller against the node's commitment
            return crypto.combine_shares(shares[:self.threshold])
        except ValueError:
            raise SecureRefused(f"secagg+: node {node}'s {what} does not rebuild from its shares") from None


def ring_seed(seed: int, server_round: int) -> int:
    """The ring's shuffle seed: public, as the graph is (it hides nothing; it makes runs replay)."""
    return int.from_bytes(hashlib.sha256(f"secagg/{seed}/{server_round}".encode()).digest()[:8], "little")


Admit = Callable[[dict[int, dict]], dict[int, str]]
