"""Federated evaluation (`fraction-evaluate`), as Flower's strategies do it: after a round's
training, a sample of the connected nodes gets the global model in an EVALUATE message (the
round's training instruction: the model, the recipe, `config` and the algorithm's records),
each evaluates it on its own held-out split and replies with `num-examples` and its scores; the
strategy aggregates them into the round's row. Central evaluation stays the default (0).

adaptfl's ClientApp (client_app/app.py `handle_evaluate`) reports the global model's scores and
those of its locally adapted model (`personal-*`); a ClientApp of your own reports what it
computes (Flower's `eval_loss` / `eval_acc` read as `eval-loss` / `eval-accuracy`). Per score:
a trimmed mean over the replies that report it, weighted by their `num-examples` (capped at
max-weight-ratio × the round's median claim, as the training weights are), and for the
accuracies the worst decile of the values kept: the h lowest and h highest values are cut first,
h from hostile-fraction and at least one (robust_scores.py), so one liar, or the declared share
of them, cannot move a figure outside the honest clients' range. A reply that fails, comes from
a node not sampled for it, or holds no valid (finite) score is dropped with its reason, as a
training reply is. Under dp these values are not released (privacy/release.py): they go to
server-confidential.jsonl only.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid

from adaptfl.algorithms.config import RunConfig
from adaptfl.algorithms.recipe import EVALUATE_STEPS
from adaptfl.codec.codec import wire_bytes
from adaptfl.core import wire
from adaptfl.privacy.release import detail_level, released
from adaptfl.strategies.robust_scores import cut_per_end, trimmed, weighted_mean, worst_decile
from adaptfl.strategies.screen import cap_to_median
from adaptfl.strategies.state import ServerState
from adaptfl.strategies.validation import ReplyRejected

if TYPE_CHECKING:
    from flwr.app.typing import MetricRecordValues

log = logging.getLogger("adaptfl.strategies.base")  # the strategy's logger

# reply score -> the row's weighted-mean column; accuracies also get a worst-decile column
MEANS = {wire.EVAL_ACCURACY: "fed-eval-accuracy", wire.EVAL_LOSS: "fed-eval-loss",
         wire.PERSONAL_ACCURACY: "fed-eval-personal-accuracy", wire.PERSONAL_LOSS: "fed-eval-personal-loss"}
DECILES = {wire.EVAL_ACCURACY: "fed-eval-accuracy-p10",
           wire.PERSONAL_ACCURACY: "fed-eval-personal-accuracy-p10"}
ACCURACIES = (wire.EVAL_ACCURACY, wire.PERSONAL_ACCURACY)


@dataclass
class EvaluationReport:
    """One round's federated evaluation, for the metrics row."""

    sampled: int = 0
    bytes_down: int = 0  # the evaluate messages' array records as they go over the wire
    metrics: dict[str, float] = field(default_factory=dict)  # the row's fed-eval-* means and deciles
    clients: dict[str, dict[str, float]] = field(default_factory=dict)  # partition id -> its scores
    rejected: dict[str, str] = field(default_factory=dict)  # node id -> why its reply was dropped
    trimmed_per_end: int = 0  # replies cut at each end of every score (robust_scores.py)
    weights_capped: int = 0  # replies whose num-examples was capped (max-weight-ratio)

    def row(self, seconds: float) -> dict[str, Any]:
        out: dict[str, Any] = {**self.metrics, "fed-eval-sampled": self.sampled,
                               "fed-eval-bytes-down": self.bytes_down,
                               "fed-eval-replies": len(self.clients), "fed-eval-seconds": seconds,
                               "fed-eval-trimmed-per-end": self.trimmed_per_end,
                               "fed-eval-weights-capped": self.weights_capped,
                               "fed-eval-clients": self.clients}
        if self.rejected:
            out["fed-eval-rejected"] = dict(self.rejected)
        return out


def evaluation_sample(seed: int, server_round: int, nodes: Sequence[int], fraction: float) -> list[int]:
    """max(1, round(fraction·N)) of the N nodes, from a generator of (seed, round) alone: the
    training sample's RNG (in the server state) is not drawn from, so turning evaluation on
    changes no training round, and a resumed run draws the same evaluation sample."""
    digest = hashlib.sha256(f"{seed}/evaluate/{server_round}".encode()).digest()
    generator = torch.Generator().manual_seed(int.from_bytes(digest[:7], "little"))
    count = max(1, round(fraction * len(nodes)))
    return sorted(nodes[i] for i in torch.randperm(len(nodes), generator=generator)[:count].tolist())


def read_scores(msg: Message) -> dict[str, float]:
    """A reply's scores by their wire names (Flower's names mapped), with num-examples and the
    partition id where given; ReplyRejected for a reply without a valid one."""
    record = msg.content.metric_records.get(wire.METRICS)
    if record is None:
        raise ReplyRejected(f"no {wire.METRICS!r} record")
    values = {wire.EVAL_ALIASES.get(k, k): v for k, v in record.items()}
    examples = values.get(wire.NUM_EXAMPLES)
    if not isinstance(examples, int | float) or not math.isfinite(examples) or examples < 1:
        raise ReplyRejected(f"{wire.NUM_EXAMPLES}={examples!r}: a count >= 1 is required")
    scores: dict[str, float] = {wire.NUM_EXAMPLES: float(examples)}
    for key in MEANS:
        value = values.get(key)
        if value is None:
            continue
        if not isinstance(value, int | float) or not math.isfinite(value) or \
                (key in ACCURACIES and not 0.0 <= value <= 1.0):
            wanted = "share in [0, 1]" if key in ACCURACIES else "value"
            raise ReplyRejected(f"{key}={value!r}: not a finite {wanted}")
        scores[key] = float(value)
    if len(scores) == 1:
        raise ReplyRejected(f"none of the scores {sorted(MEANS)} (or Flower's eval_loss, eval_acc)")
    if isinstance(values.get(wire.PARTITION_ID), int):
        scores[wire.PARTITION_ID] = float(cast(int, values[wire.PARTITION_ID]))
    return scores


def aggregate_scores(clients: Sequence[dict[str, float]], max_weight_ratio: float,
                     hostile_fraction: float = 0.0) -> tuple[dict[str, float], int, int]:
    """(the row's fed-eval-* values, h cut at each end of the replies, weights capped): the
    module docstring's robust estimate; a score no reply reports is absent."""
    claims = [c[wire.NUM_EXAMPLES] for c in clients]
    weights = cap_to_median(claims, max_weight_ratio)
    out: dict[str, float] = {}
    for key, column in MEANS.items():
        pairs = [(c[key], w) for c, w in zip(clients, weights, strict=True) if key in c]
        if not pairs:
            continue
        values, kept_weights = trimmed([v for v, _ in pairs], [w for _, w in pairs],
                                       cut_per_end(hostile_fraction, len(pairs)))
        out[column] = weighted_mean(values, kept_weights)
        if key in DECILES:
            out[DECILES[key]] = worst_decile(values)
    capped = sum(w < c for w, c in zip(weights, claims, strict=True))
    return out, cut_per_end(hostile_fraction, len(clients)), capped


def client_table(ordered: Sequence[tuple[int, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Partition id -> a reply's values and its node id, as the training row's `clients`; a reply
    without a partition id, or whose id another reply took, under "node-<node id>"."""
    table: dict[str, dict[str, float]] = {}
    for node, values in ordered:
        key = str(int(values[wire.PARTITION_ID])) if wire.PARTITION_ID in values else f"node-{node}"
        ints = (wire.PARTITION_ID, wire.NUM_EXAMPLES)
        table[f"node-{node}" if key in table else key] = \
            {**{k: int(v) if k in ints else v for k, v in values.items()}, "node-id": node}
    return table


class FederatedEvaluation:
    """configure_evaluate / aggregate_evaluate of `AdaptiveStrategy`, on its state."""

    cfg: RunConfig
    state: ServerState | None
    eval_report: EvaluationReport
    _eval_messages: list[Message]

    def instruction(self, server_round: int, config: ConfigRecord | None = None,
                    sampled: int = 1) -> RecordDict:  # AdaptiveStrategy's
        raise NotImplementedError

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        """The round's EVALUATE messages: none unless fraction-evaluate > 0."""
        self.eval_report, self._eval_messages = EvaluationReport(), []
        fed = self.cfg.federation
        nodes = sorted(grid.get_node_ids()) if fed.fraction_evaluate > 0 else []
        if not nodes or self.state is None:
            return []
        sampled = evaluation_sample(fed.seed, server_round, nodes, fed.fraction_evaluate)
        content = self.instruction(server_round, config, len(sampled))  # self.state.model: `arrays`
        content.config_records[wire.RECIPE][EVALUATE_STEPS] = fed.evaluate_local_steps
        self._eval_messages = [Message(content=content, dst_node_id=node, message_type=MessageType.EVALUATE)
                               for node in sampled]
        self.eval_report.sampled = len(sampled)
        # bytes-down counts training's messages; evaluation's model broadcast is its own column
        self.eval_report.bytes_down = len(sampled) * sum(map(wire_bytes, content.array_records.values()))
        return self._eval_messages

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """The round's fed-eval-* values from the replies that count (in `eval_report`); what
        Flower's `Strategy.start` logs: under dp nothing of them (not released)."""
        if self.cfg.federation.fraction_evaluate <= 0:
            return None
        accepted = self._accept_scores(replies)
        report = self.eval_report
        # in partition order: the same sums under any transport (Flower's node ids are random)
        ordered = sorted(accepted.items(),
                         key=lambda item: (item[1].get(wire.PARTITION_ID, math.inf), item[0]))
        scores = [s for _, s in ordered]
        report.clients = client_table(ordered)
        if scores:
            fed = self.cfg.federation
            report.metrics, report.trimmed_per_end, report.weights_capped = \
                aggregate_scores(scores, fed.max_weight_ratio, fed.hostile_fraction)
        private = self.cfg.privacy.on
        log.log(detail_level(private, logging.INFO), "round %d: federated evaluation, %d of %d "
                "replies: %s", server_round, len(scores), report.sampled,
                ", ".join(f"{k} {v:.4f}" for k, v in report.metrics.items()) or "no scores")
        metrics = released(report.metrics) if private else report.metrics
        return MetricRecord(cast("dict[str, MetricRecordValues]", metrics)) if metrics else None

    def _accept_scores(self, replies: Iterable[Message]) -> dict[int, dict[str, float]]:
        """node -> its scores, for the replies that answer this round's EVALUATE messages, one per
        node, sent by that node; the others are in eval_report.rejected with why. A reply sent in
        another node's name is dropped alone (it cannot make the victim's own reply a second one)."""
        sent = {m.metadata.message_id: m.metadata.dst_node_id for m in self._eval_messages
                if m.metadata.message_id}
        sampled = {m.metadata.dst_node_id for m in self._eval_messages}
        accepted: dict[int, dict[str, float]] = {}
        seen: set[int] = set()
        for msg in replies:
            src = msg.metadata.src_node_id
            node = sent.get(msg.metadata.reply_to_message_id) if sent else (src if src in sampled else None)
            if node is not None and not msg.has_error() and src != node:
                self._reject_score(f"{src}->{node}", f"reply to node {node}'s evaluate message sent by "
                                                     f"node {src}")
                continue
            try:
                if node in seen:  # one sampled node, one reply: neither of two is trusted
                    accepted.pop(node, None)
                    raise ReplyRejected("more than one evaluate reply from one node")
                scores = self._scores_of(node, msg)
            except ReplyRejected as why:
                self._reject_score("unknown" if node is None else str(node), str(why))
                continue
            finally:
                if node is not None:
                    seen.add(node)
            accepted[cast(int, node)] = scores
        return accepted

    @staticmethod
    def _scores_of(node: int | None, msg: Message) -> dict[str, float]:
        if node is None:
            raise ReplyRejected("a reply to no evaluate message of this round")
        if msg.has_error():
            last = ((msg.error.reason or "").strip().splitlines() or ["no reason given"])[-1]
            raise ReplyRejected(f"the client failed: {last}")
        if msg.metadata.message_type != MessageType.EVALUATE:
            raise ReplyRejected(f"message type {msg.metadata.message_type!r}, expected "
                                f"{MessageType.EVALUATE!r}")
        return read_scores(msg)

    def _reject_score(self, node: str, why: str) -> None:
        self.eval_report.rejected[node] = why
        log.log(detail_level(self.cfg.privacy.on), "evaluate reply from node %s dropped: %s", node, why)
