"""Which replies of a round count (`ReplyIntake`, a part of `AdaptiveStrategy`): only the answer
to an instruction of this round, one per sampled node, sent by that node, as a train reply; its
records, shapes, dtypes, values and size against the algorithm's contract (validation.py); a
partition id its node holds (ownership.py); then the screen against the round's others
(screen.py: every shared record; a lone reply against the screen reference). A bad reply is
dropped with its reason in the round's report, never raised into the round; the claimed
weights are capped at max-weight-ratio × the round's median."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from flwr.app import ConfigRecord, Message, MessageType

from adaptfl.algorithms.config import RunConfig
from adaptfl.algorithms.settings import parse_partition_map
from adaptfl.codec.codec import spec_bytes
from adaptfl.core import wire
from adaptfl.core.contract import ArraySpec, Contract, ModelSpec
from adaptfl.core.domain import Domain
from adaptfl.privacy.mechanism import metric_domains, reply_domains
from adaptfl.privacy.release import detail_level
from adaptfl.strategies import contribution
from adaptfl.strategies.contribution import clip_contributions, clip_to_history
from adaptfl.strategies.ownership import Ownership, bind_by_claims, bind_by_map
from adaptfl.strategies.screen import (
    CLAIMS,
    HISTORY,
    cap_to_median,
    capped_factors,
    is_young,
    next_history,
    reference_of,
    round_sizes,
    screened,
)
from adaptfl.strategies.state import RoundReport, ServerState
from adaptfl.strategies.validation import (
    Codecs,
    DecodedReply,
    ReplyRejected,
    decode_reply,
    reply_bound,
    summation_order,
)

log = logging.getLogger("adaptfl.strategies.base")  # the strategy's logger, as before the split


# the records max-contribution-ratio bounds: the clients' moves (v, Θ, gradients are states
# and estimates, bounded by the screen and their domains)
CLIPPED_RECORDS = (wire.DELTA, wire.DELTA_C)

class ReplyIntake:
    """The reply checks of `AdaptiveStrategy`, on its round state (set there)."""

    cfg: RunConfig
    spec: ModelSpec | None
    state: ServerState | None
    report: RoundReport
    _messages: list[Message]  # this round's instructions
    _connected: set[int]  # nodes connected at the last sampling
    screen_reference: dict[str, list[float]]  # the next round's history, committed with this round's state
    ownership_next: Ownership  # the partition ledger after this round's claims, committed likewise
    partition_sizes: list[int] | None  # where the server knows the partitioning (AdaptiveStrategy)

    def contract(self, server_round: int | None = None) -> Contract:  # AdaptiveStrategy's
        raise NotImplementedError

    def learn_held(self, echoes: Mapping[int, ConfigRecord | None]) -> None:  # broadcast.py's
        raise NotImplementedError

    def reply_codecs(self, server_round: int = 1) -> Codecs:
        """Each reply record's codec in that round (adaptfl/codec/; codec-warmup), and the block size."""
        assert self.spec is not None
        compression = self.cfg.compression.for_round(server_round)
        return {name: compression.of(name) for name in self.contract().reply_spec(self.spec)}, \
            compression.codec_block

    def wire_reply_spec(self, server_round: int = 1) -> dict[str, ArraySpec]:
        """The reply's records as they come over the wire (encoded), what the size bound counts."""
        assert self.spec is not None
        codecs, block = self.reply_codecs(server_round)
        return {name: codecs[name].record_spec(spec, block)
                for name, spec in self.contract().reply_spec(self.spec).items()}

    def _sender(self, reply: Message, sent: Mapping[str, int]) -> int | None:
        """The sampled node a reply answers for, by the id of the instruction it replies to (Flower
        shows a vanished node's error as sent by the SuperLink); None: not an instruction of ours.
        `sent`: instruction id -> node, built once a round (per reply, it made a round O(S²))."""
        if not sent:  # transports that set no ids: trust the sender, if it was sampled
            sampled = {m.metadata.dst_node_id for m in self._messages}
            return reply.metadata.src_node_id if reply.metadata.src_node_id in sampled else None
        return sent.get(reply.metadata.reply_to_message_id)

    @staticmethod
    def _check_identity(node: int, msg: Message) -> None:
        """A reply (not an error, which the SuperLink may send for a vanished node) must come from
        the node its instruction went to, as a train reply."""
        meta = msg.metadata
        if msg.has_error():
            return
        if meta.src_node_id != node:
            raise ReplyRejected(f"reply to node {node}'s instruction sent by node {meta.src_node_id}")
        if meta.message_type != MessageType.TRAIN:
            raise ReplyRejected(f"message type {meta.message_type!r}, expected {MessageType.TRAIN!r}")

    def _accept(self, replies: Iterable[Message], server_round: int) -> list[tuple[int, DecodedReply]]:
        """The round's replies that count, in summation order: grouped by the node they answer
        for, each decoded against the round's contract, partition ids bound, screened, then each
        one's weighted contribution clipped (`_clip`)."""
        by_node = self._by_node(replies)
        accepted = self._decode_all(by_node, server_round)
        assert self.state is not None
        for node, why in self._bind(accepted).items():
            accepted.pop(node)
            self._reject(str(node), why)
        pairs = sorted(accepted.items(), key=summation_order(accepted))
        indices, restart = self._screen(pairs)
        kept = [pairs[i] for i in indices]
        self._clip([r for _, r in kept])
        self._remember([r for _, r in kept], restart)
        for node, reply in kept:  # only now: a dropped claimer of another's partition id notes nothing
            self.report.note_client(node, reply.metrics)
        return kept

    def _bind(self, accepted: Mapping[int, DecodedReply]) -> dict[int, str]:
        """node -> why its partition-id claim is dropped (ownership.py): the operator's
        partition-map where given, else the rule for claims. On a copy of the state's ledger,
        `ownership_next`: a skipped or refused round leaves the state as it was, ledger too."""
        assert self.state is not None
        outside = self._outside_partitioning(accepted)
        claims = {node: reply.metrics for node, reply in accepted.items() if node not in outside}
        self.ownership_next = self.state.ownership.clone()
        mapping = parse_partition_map(self.cfg.federation.partition_map)  # checked before round 1
        if mapping:
            return {**outside, **bind_by_map(claims, mapping, self.ownership_next)}
        return {**outside, **bind_by_claims(claims, self.ownership_next, self._connected)}

    def _outside_partitioning(self, accepted: Mapping[int, DecodedReply]) -> dict[int, str]:
        """node -> why: a partition id that the server's partitioning does not have (known where
        the server holds it, the in-process engine: ids 0..N-1); such a claim binds nothing."""
        sizes = self.partition_sizes
        if sizes is None:
            return {}
        return {node: f"{wire.PARTITION_ID}={int(reply.metrics[wire.PARTITION_ID])} is outside the "
                      f"partitioning's ids 0..{len(sizes) - 1}"
                for node, reply in accepted.items() if wire.PARTITION_ID in reply.metrics
                and not 0 <= int(reply.metrics[wire.PARTITION_ID]) < len(sizes)}

    def _by_node(self, replies: Iterable[Message]) -> dict[int | None, list[Message]]:
        """Replies by the sampled node they answer for; a forged one (sent by another node) is
        dropped alone, kept out of the victim's bucket so it cannot drop the victim's reply."""
        by_node: dict[int | None, list[Message]] = {}
        sent = {m.metadata.message_id: m.metadata.dst_node_id
                for m in self._messages if m.metadata.message_id}
        forged: list[tuple[int, Message]] = []
        for msg in replies:
            node = self._sender(msg, sent)
            if node is not None and not msg.has_error() and msg.metadata.src_node_id != node:
                forged.append((node, msg))
                continue
            by_node.setdefault(node, []).append(msg)
        for node, msg in forged:
            self._reject(f"{msg.metadata.src_node_id}->{node}", f"reply to node {node}'s "
                         f"instruction sent by node {msg.metadata.src_node_id}")
        # a node that replied, well-formed or not, is not a missing one (min-replies); a failure
        # (Flower's error reply) is one: an honest client whose training crashed sends it
        self.report.answered = sum(node is not None and any(not m.has_error() for m in msgs)
                                   for node, msgs in by_node.items())
        return by_node

    def _decode_all(self, by_node: Mapping[int | None, list[Message]], server_round: int
                    ) -> dict[int, DecodedReply]:
        contract = self.contract()
        assert self.spec is not None
        # this round's records: a reply with v in a round without it is refused (v-sync-every)
        expected = self.contract(server_round).reply_spec(self.spec)
        domains = reply_domains(contract, self.cfg.privacy)  # dp='client': noised, then projected
        metrics = metric_domains(contract, self.cfg.privacy)
        max_bytes = reply_bound(self.cfg.federation.max_reply_mb, self.wire_reply_spec(server_round))
        codecs = self.reply_codecs(server_round)
        accepted: dict[int, DecodedReply] = {}
        for node, msgs in by_node.items():
            try:
                decoded = self._decode_one(node, msgs, expected, max_bytes, domains, metrics, codecs)
            except ReplyRejected as why:
                self._reject("unknown" if node is None else str(node), str(why))
                continue
            except Exception as err:  # noqa: BLE001 - whatever one reply holds, it cannot stop the round
                self._reject(str(node), f"undecodable reply ({type(err).__name__}: {err})")
                continue
            assert node is not None
            self.report.bytes_up += decoded.num_bytes
            self.report.fp32_bytes += sum(spec_bytes(spec) for spec in expected.values())
            for name, size in decoded.record_bytes.items():
                self.report.up_bytes[name] = self.report.up_bytes.get(name, 0) + size
            accepted[node] = decoded
        self.learn_held({node: reply.versions for node, reply in accepted.items()})  # screened or not
        return accepted

    def _decode_one(self, node: int | None, msgs: list[Message], expected: Mapping[str, ArraySpec],
                    max_bytes: int, domains: Mapping[str, Mapping[str, Domain]],
                    metrics: Mapping[str, Domain], codecs: Codecs) -> DecodedReply:
        if node is None:
            raise ReplyRejected(f"{len(msgs)} repl{'ies' if len(msgs) > 1 else 'y'} to no "
                                "instruction of this round")
        if len(msgs) > 1:  # one sampled node, one reply: a second one is not trusted
            raise ReplyRejected(f"{len(msgs)} replies from one node")
        self._check_identity(node, msgs[0])
        self.report.latency[str(node)] = self._latency(node, msgs[0])
        return decode_reply(msgs[0], expected, max_bytes, self.contract().up_metrics, domains, metrics,
                            detail_level(self.cfg.privacy.on), codecs)

    def _squared(self) -> set[str]:
        """The records compared by the square root of their norm (v ≥ 0, PSD statistics)."""
        return {r for r, doms in self.contract().domains.items()
                if any(d.nonneg or d.psd for d in doms.values())}

    def _screen(self, pairs: list[tuple[int, DecodedReply]]) -> tuple[list[int], bool]:
        """Indices of `pairs` that pass the screen against the round's others (screen.py): every
        shared record (Δ and the contract's `up`), a lone reply against the screen history in
        the server state; and whether that history was young and screened a lone reply (so it
        restarts: screen.py next_history)."""
        assert self.state is not None
        replies = [r for _, r in pairs]
        factors = capped_factors(self._claims(replies, capped=False), self._claims(replies))
        # under dp, clipping bounds every reply; a screen that drops by value would leak
        limit = 0.0 if self.cfg.privacy.on else self.cfg.federation.screen_ratio
        reference = reference_of(self.state.extras)
        # the records of the contract, not its metrics: f̂_i (HaFedHo) is a constant of the local
        # objective, so it moves no gradient, and honest losses of two non-IID clients came
        # 8.8× apart in the hafedho grid; its domain bound (|f̂| < 1.8e19) holds it
        kept, screened_out, self.report.screen_ratio_max = screened(
            replies, factors, limit, self._squared(), reference=reference)
        for i, why in screened_out.items():
            self._reject(str(pairs[i][0]), why + (" (a screen reference of fewer than 3 replies: "
                                                  "restarted)" if len(replies) == 1 and
                                                  is_young(reference) else ""))
        self.report.screened = len(screened_out)
        return kept, len(replies) == 1 and bool(screened_out) and is_young(reference)

    def _remember(self, kept: list[DecodedReply], restart: bool) -> None:
        """`self.screen_reference`: the history with the kept replies' sizes (after the bound)
        and capped claims, for aggregate_train to commit with the round's state; none under dp
        (the replies' norms are not part of the release)."""
        assert self.state is not None
        fed = self.cfg.federation
        if self.cfg.privacy.on or (fed.screen_ratio <= 0.0 and fed.max_contribution_ratio <= 0.0):
            self.screen_reference = {}  # nothing reads it: the state is the papers' own
            return
        if restart:  # on the state itself: the round is skipped (its one reply screened), and a
            self.state.extras.pop(HISTORY, None)  # kept young history would screen every later one
        sizes = {**round_sizes(kept, self._squared()), CLAIMS: self._claims(kept)} if kept else {}
        self.screen_reference = next_history(reference_of(self.state.extras), sizes)

    def _clip(self, replies: list[DecodedReply]) -> None:
        """Each kept reply's weighted deviation from the round's coordinate-wise median at most
        max-contribution-ratio × the round's median one, per record that moves a mean the clients
        steer: Δ, and SCAFFOLD's Δc, which a flipped client sends too (contribution.py); in a
        round of one or two replies, each one's weighted size against the history of earlier
        kept replies instead; off under dp, whose clipping bounds every reply."""
        assert self.state is not None
        ratio = 0.0 if self.cfg.privacy.on else self.cfg.federation.max_contribution_ratio
        weights = self._claims(replies)
        history = reference_of(self.state.extras)
        small = min(ratio, contribution.SMALL_ROUND_RATIO)
        clipped: set[int] = set()
        for record in CLIPPED_RECORDS:
            if replies and all(record in r.arrays for r in replies):
                clipped |= clip_contributions(replies, weights, ratio, record) if len(replies) >= 3 \
                    else clip_to_history(replies, weights, small, record, history)
        self.report.clipped = len(clipped)

    def _latency(self, node: int, reply: Message) -> float:
        """Seconds from the instruction's creation to the reply's (the hosts' clocks may differ
        in a deployment: a skew shows up here too)."""
        sent = next((m.metadata.created_at for m in self._messages
                     if m.metadata.dst_node_id == node), reply.metadata.created_at)
        return max(0.0, float(reply.metadata.created_at) - float(sent))

    def _claims(self, replies: list[DecodedReply], capped: bool = True) -> list[float]:
        """The replies' weights as claimed; `capped`: at max-weight-ratio × the round's median."""
        fed = self.cfg.federation
        claimed = [float(r.metrics[wire.NUM_EXAMPLES]) if fed.weighting == "examples" else 1.0
                   for r in replies]
        # under dp the median cap is off: through the median one client's claim would move the
        # others' weights, outside the share bound the noise is sized for (privacy/mechanism.py)
        ratio = 0.0 if self.cfg.privacy.on else fed.max_weight_ratio
        return cap_to_median(claimed, ratio) if capped else claimed

    def _reject(self, node: str, why: str) -> None:
        self.report.rejected[node] = why
        # under dp who and why (a reason may quote a client's values) are the server's alone
        log.log(detail_level(self.cfg.privacy.on), "round reply from node %s dropped: %s", node, why)
