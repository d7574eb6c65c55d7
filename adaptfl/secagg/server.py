"""The server's side of SecAgg+ (protocol.py): one round's five exchanges over a Flower Grid,
and the unmasked sum. A node that errs, is late or answers out of contract drops out (with its
reason); the round goes on while every secret it needs has t shares, and otherwise ends with a
reason and no sum (SecureRefused): never a wrong sum. A node that check-shares finds at fault
(blame.py) is removed before any input is masked and the round starts again from setup among
the others (at most once per node removed), so its garbage costs only itself: the honest
nodes' secrets never lack the shares it spoilt. A sum that no inputs in range could have made
(fixedpoint.beyond_reach) is refused too.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from adaptfl.codec.codec import wire_bytes
from adaptfl.core import wire
from adaptfl.secagg import blame, crypto, fixedpoint
from adaptfl.secagg import protocol as p


class SecureRefused(RuntimeError):
    """The round cannot be unmasked (too few shares, too few nodes): the message says why."""


class OutOfReach(SecureRefused):
    """The unmasked sum is one no inputs in range reach: some node of `live` lied (the search
    for it: strategies/secagg_search.py)."""

    def __init__(self, why: str, live: list[int]) -> None:
        super().__init__(why)
        self.live = live


@dataclass
class SecureRound:
    """What one SecAgg+ round gives the strategy."""

    total: np.ndarray | None = None  # the live nodes' summed integers (int64), None if refused
    live: list[int] = field(default_factory=list)  # nodes whose masked input is in the sum
    metrics: dict[int, dict[str, Any]] = field(default_factory=dict)  # each live node's plain metrics
    dropped: dict[int, str] = field(default_factory=dict)  # node -> why it left the round
    bytes_down: int = 0
    bytes_up: int = 0
    latency: dict[int, float] = field(default_factory=dict)
    # each masked reply's echo of the broadcast versions its node holds (codec/versions.py)
    versions: dict[int, ConfigRecord | None] = field(default_factory=dict)


def content_bytes(content: RecordDict) -> int:
    """A message's payload bytes: its arrays' serialised bytes and its config values' bytes."""
    total = sum(map(wire_bytes, content.array_records.values()))
    for rec in content.config_records.values():
        for value in rec.values():
            items = value if isinstance(value, list) else [value]
            total += sum(len(v) if isinstance(v, bytes | str) else 8 for v in items)
    return total


class SecAggServer:
    """Runs one round: `run(grid, nodes, instruction, layout)` with a `send(messages)` of the grid."""

    def __init__(self, shares: int, threshold: int, bits: int, bound: int, noise_std: float,
                 timeout: float | None, seed: int, server_round: int,
                 plan: Callable[[int], tuple[int, int]] | None = None) -> None:
        self.shares, self.threshold, self.bits, self.bound = shares, threshold, bits, bound
        # (shares, threshold) of a restart among n nodes: the run's secagg-threshold share
        self.plan = plan or (lambda n: (min(shares, n),
                                        max(2, math.ceil(threshold / shares * min(shares, n)))))
        self.noise_std, self.timeout, self.round = noise_std, timeout, server_round
        self.seed = seed
        self.out = SecureRound()
        # the round's state, stage by stage
        self.neighbours: dict[int, set[int]] = {}
        self.server_key = crypto.KeyPair()  # fresh each round: the proofs of possession use it
        self.enc: dict[int, dict[int, bytes]] = {}  # node -> peer -> its key for that pair
        self.mask_keys: dict[int, bytes] = {}
        self.sealed: dict[int, dict[int, bytes]] = {}  # sender -> receiver -> ciphertext
        self.digests: dict[int, blame.Digests] = {}  # owner -> (kind, holder) -> share's hash
        self.commits: dict[int, bytes] = {}  # sender -> H(b)
        self.masked: dict[int, np.ndarray] = {}
        self.masked_with: dict[int, set[int]] = {}  # node -> the peers whose masks are in its y
        self.spoilers: list[int] = []  # nodes that returned a share other than the one they got
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

    def run(self, grid: Grid, nodes: list[int], instruction: RecordDict | Mapping[int, RecordDict],
            layout: list[fixedpoint.Slot], clips: dict[str, float], admit: Admit | None = None
            ) -> SecureRound:
        """The round's sum, one function per stage of protocol.py's table; `instruction`: the
        training instruction, one for all or each node's own (codec/versions.py); `admit(metrics
        by node)` names the masked replies to drop (their plain metrics checked, partitions
        bound) before anything is unmasked."""
        members = sorted(nodes)
        while True:  # each pass removes at least one node at fault, or is the last
            if len(members) < 3:
                raise SecureRefused(f"secagg+: {len(members)} nodes left; a sum needs 3 or more")
            self.shares, self.threshold = self.plan(len(members))
            self.neighbours = p.ring_neighbours(members, self.shares, self.seed)
            alive = self._share_keys(grid, self._setup(grid, members))
            faults = self._check_shares(grid, alive)
            if not faults:
                break
            members = [n for n in members if n not in self.out.dropped]
        live = self._masked_input(grid, self._prune(alive - set(self.out.dropped), p.CHECK_SHARES),
                                  instruction, layout, clips, admit)
        total = fixedpoint.from_ring(self._unmask(grid, live, alive - live), self.bits)
        why = fixedpoint.beyond_reach(total, layout, self.bound, len(live), self.noise_std)
        if why:  # what no len(live) inputs in range reach: a node lied about its input
            raise OutOfReach(why, sorted(live))
        self.out.total, self.out.live = total, sorted(live)
        return self.out

    # --- the stages ------------------------------------------------------------------------------
    def _setup(self, grid: Grid, nodes: list[int]) -> set[int]:
        """Fresh keys, each proven held (blame.py). Drops: no reply, an error, a key missing,
        not an X25519 key or without its proof, a key two nodes prove or one node twice."""
        self.server_key = crypto.KeyPair()
        self.enc, self.mask_keys, self.sealed, self.digests, self.commits = {}, {}, {}, {}, {}
        replies = self._exchange(grid, {n: self._config(p.SETUP, {
            p.SHARES: self.shares, p.THRESHOLD: self.threshold, p.SERVER_KEY: self.server_key.public,
            p.NEIGHBOURS: sorted(self.neighbours[n])}) for n in nodes}, p.SETUP)
        for node, content in replies.items():
            got = blame.signed_up_keys(content.config_records.get(wire.SECAGG, ConfigRecord()), node,
                                       self.neighbours[node], self.server_key, self.round)
            if isinstance(got, str):
                self._drop(node, f"setup: {got}")
                continue
            self.enc[node], self.mask_keys[node] = got
        for node, why in blame.shared_keys({n: [*self.enc[n].values(), self.mask_keys[n]]
                                            for n in self.enc}).items():
            self._drop(node, why)
            del self.enc[node], self.mask_keys[node]
        return self._prune(set(self.enc), p.SETUP)

    def _share_keys(self, grid: Grid, alive: set[int]) -> set[int]:
        """The encrypted shares, each share's hash and the commitment to b. Drops: not one
        ciphertext per live neighbour, a hash per share and a commitment."""
        replies = self._exchange(grid, {n: self._config(p.SHARE_KEYS, {
            **{f"{p.PK_ENC}:{j}": self.enc[j][n] for j in self.neighbours[n] & alive},
            **{f"{p.PK_MASK}:{j}": self.mask_keys[j] for j in self.neighbours[n] & alive}})
            for n in sorted(alive)}, p.SHARE_KEYS)
        for node, content in replies.items():
            rec = content.config_records.get(wire.SECAGG, ConfigRecord())
            peers = self.neighbours[node] & alive
            hashes = {(kind, h): f"{name}:{h}" for h in peers | {node}
                      for kind, name in (("b", p.HASH_B), ("s", p.HASH_S))}
            if set(rec) != {p.key_of(j) for j in peers} | set(hashes.values()) | {p.COMMIT} \
                    or not all(isinstance(v, bytes) for v in rec.values()):
                self._drop(node, "share-keys: not one encrypted share per live neighbour, a hash per "
                                 "share and a commitment")
                continue
            self.commits[node] = bytes(rec[p.COMMIT])  # type: ignore[arg-type]
            self.sealed[node] = {j: bytes(rec[p.key_of(j)]) for j in peers}  # type: ignore[arg-type]
            self.digests[node] = {k: bytes(rec[name]) for k, name in hashes.items()}  # type: ignore[arg-type]
        return self._prune(set(self.sealed), p.SHARE_KEYS)  # U2: their masks are in their peers' y

    def _check_shares(self, grid: Grid, alive: set[int]) -> dict[int, str]:
        """Each node gets the shares sent to it and answers with its blames, each checked
        (blame.at_fault): {node at fault: why}, dropped; a node that does not answer drops out.
        Without faults each live node masks with all its live neighbours (it opened them all)."""
        replies = self._exchange(grid, {n: self._config(p.CHECK_SHARES, {
            **{f"ct:{j}": self.sealed[j][n] for j in self.neighbours[n] & alive},
            **{f"{p.HASH_B}:{j}": self.digests[j][("b", n)] for j in self.neighbours[n] & alive},
            **{f"{p.HASH_S}:{j}": self.digests[j][("s", n)] for j in self.neighbours[n] & alive}})
            for n in sorted(alive)}, p.CHECK_SHARES)
        faults: dict[int, str] = {}
        for node in sorted(replies):  # judged after all are in: reply order does not enter
            rec = replies[node].config_records.get(wire.SECAGG, ConfigRecord())
            blamed = {int(k[len(p.BLAME) + 1:]): v for k, v in rec.items()
                      if k.startswith(p.BLAME + ":") and k[len(p.BLAME) + 1:].isdigit()}
            if len(blamed) != len(rec):
                faults.setdefault(node, "check-shares: a reply other than blames")
            for accused, private in sorted(blamed.items()):
                culprit, why = blame.at_fault(node, accused, private, self.enc, self.sealed, self.digests)
                faults.setdefault(culprit, why)
        for node, why in faults.items():
            self._drop(node, why)
        kept = set(replies) - set(faults)
        self.masked_with = {n: self.neighbours[n] & kept for n in kept}
        return faults

    def _masked_input(self, grid: Grid, alive: set[int], instruction: RecordDict | Mapping[int, RecordDict],
                      layout: list[fixedpoint.Slot], clips: dict[str, float], admit: Admit | None
                      ) -> set[int]:
        """y with the training instruction and the peers to mask with. Drops: a malformed y,
        no metrics, a reply `admit` refuses (before anything is unmasked: a reply refused
        afterwards stays in the sum)."""
        setup: dict[str, Any] = {p.BITS: self.bits, p.BOUND: self.bound, p.NOISE_STD: self.noise_std,
                                 p.SEED: self.seed, p.LAYOUT: [f"{s.record}/{s.name}" for s in layout],
                                 **{f"clip:{r}": c for r, c in clips.items()}}
        self.masked_with = {n: self.masked_with[n] & alive for n in alive}
        contents = {}
        for n in sorted(alive):
            content = RecordDict(dict(instruction if isinstance(instruction, RecordDict) else instruction[n]))
            content[wire.SECAGG] = ConfigRecord({p.STAGE: p.MASKED_INPUT, p.ROUND: self.round, **setup,
                                                 p.MASK_WITH: sorted(self.masked_with[n])})
            contents[n] = content
        replies = self._exchange(grid, contents, p.MASKED_INPUT)
        self.length = fixedpoint.length(layout)
        for node, content in replies.items():
            why = self._check_masked(content, self.length)
            if why:
                self._drop(node, f"masked-input: {why}")
                continue
            self.masked[node] = content.array_records[wire.MASKED][p.MASKED_ARRAY].numpy().astype(np.uint64)
            self.out.metrics[node] = dict(content.metric_records[wire.METRICS])
            self.out.versions[node] = content.config_records.get(wire.VERSIONS)  # what it holds now
        refused = admit(self.out.metrics) if admit is not None else {}
        for node, why in refused.items():
            self._drop(node, f"masked-input: {why}")
            self.masked.pop(node, None)
        live = self._prune(set(self.masked), p.MASKED_INPUT)
        self.out.metrics = {n: m for n, m in self.out.metrics.items() if n in live}
        return live

    def _unmask(self, grid: Grid, live: set[int], dead: set[int]) -> np.ndarray:
        """Each live node's b and each dead node's mask key from t shares, each share checked
        against its owner's hash (a changed one names its holder, whose shares are then not
        used), each secret against its commitment; the masks removed. Refused: fewer than t
        good shares, a secret that fails its commitment (its owner named; never a wrong sum)."""
        replies = self._exchange(grid, {n: self._config(p.UNMASK, {
            p.ACTIVE: sorted((self.neighbours[n] & live) | {n}),
            p.DEAD: sorted(self.neighbours[n] & dead & self.masked_with[n])})
            for n in sorted(live)}, p.UNMASK)
        records = {n: c.config_records.get(wire.SECAGG, ConfigRecord()) for n, c in replies.items()}
        shares, bad = blame.returned_shares(records, {"b": live, "s": dead},
                                            {n: self.neighbours[n] | {n} for n in records}, self.digests)
        for holder, why in bad.items():  # its y is in the sum already: named, its changed shares unused
            self._drop(holder, why)
        self.spoilers = sorted(bad)
        total = np.zeros(self.length, dtype=np.uint64)
        for node in sorted(live):
            total += self.masked[node]
        for node in sorted(live):  # remove each live node's self mask
            commit = self.commits[node]
            seed = self._rebuild(shares["b"][node], node, "self-mask seed",
                                 lambda b: crypto.commitment(b) == commit)  # noqa: B023 - used at once
            p.add_mask(total, crypto.self_mask_key(seed), -1, self.bits)
        for node in sorted(dead):  # and the masks live peers shared with a node that vanished
            peers = {q for q in self.neighbours[node] & live if node in self.masked_with[q]}
            if not peers:
                continue
            public = self.mask_keys[node]  # its public key commits to the seed
            secret = crypto.KeyPair.from_seed(self._rebuild(
                shares["s"][node], node, "mask key",
                lambda s: crypto.KeyPair.from_seed(s).public == public))  # noqa: B023 - used at once
            for peer in sorted(peers):
                p.add_mask(total, secret.agree(self.mask_keys[peer]), -p.pair_sign(peer, node), self.bits)
        return total

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

    def _rebuild(self, shares: list[tuple[int, bytes]], node: int, what: str,
                 committed: Callable[[bytes], bool]) -> bytes:
        """The secret from t of its (holder, share) pairs: the first t by holder, else the first
        t-subset whose secret matches its commitment (a share off the owner's polynomial passes
        its hash yet spoils any t holding it: the outcome must not hang on which came first).
        Refused: fewer than t shares, or no t of them rebuilding the committed secret."""
        if len(shares) < self.threshold:
            spoilt = f"; nodes {self.spoilers} returned changed shares" if self.spoilers else ""
            raise SecureRefused(f"secagg+: node {node}'s {what} has {len(shares)} of the {self.threshold} "
                                f"shares it needs (each as its owner hashed it){spoilt}; the round is not "
                                "unmasked")
        for subset in itertools.islice(itertools.combinations(shares, self.threshold), MAX_SUBSETS):
            try:
                secret = crypto.combine_shares([share for _, share in subset])
            except ValueError:
                continue
            if committed(secret):
                return secret
        raise SecureRefused(f"secagg+: node {node}'s {what}, rebuilt from shares that match its own "
                            "hashes, does not match its commitment; the round is not unmasked")


# t-subsets of a secret's shares tried against its commitment: C(11, 8) = 165 covers the
# default neighbourhood whole; ~5 ms each (crypto.combine_shares, pure-Python GF(2^128))
MAX_SUBSETS = 256


def ring_seed(seed: int, server_round: int) -> int:
    """The ring's shuffle seed: public, as the graph is (it hides nothing; it makes runs replay)."""
    return int.from_bytes(hashlib.sha256(f"secagg/{seed}/{server_round}".encode()).digest()[:8], "little")


Admit = Callable[[dict[int, dict[str, Any]]], dict[int, str]]
