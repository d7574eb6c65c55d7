"""The strategy base: Flower's message-API `Strategy` with validated replies and one state.

Subclasses override three hooks: `reply_spec` (what a valid reply holds), `payload` (extra
ArrayRecords sent next to the model) and `aggregate` (new server state from accepted replies).
Everything else — sampling, messages, validation, weighting, metrics — lives here once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import torch
from adaptfl.algorithms import wire
from adaptfl.algorithms.config import RunConfig
from adaptfl.algorithms.presets import Resolved, resolve
from adaptfl.algorithms.recipe import recipe_for_round
from adaptfl.strategies.aggregate import direction_consistency, num_bytes, weighted_mean
from adaptfl.strategies.server_opt import ServerHyper, ServerOptimizer
from adaptfl.strategies.state import ServerState, Tensors
from adaptfl.strategies.validation import ArraySpec, DecodedReply, ReplyRejected, decode_reply
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelSpec:
    """Names, shapes and dtypes of the model: what valid arrays must look like."""

    entries: dict[str, tuple[tuple[int, ...], torch.dtype]]  # every state_dict entry
    parameters: tuple[str, ...]  # the trainable ones (optimizer state exists for these)

    @classmethod
    def of(cls, model: torch.nn.Module) -> ModelSpec:
        entries = {n: (tuple(t.shape), t.dtype) for n, t in model.state_dict().items()}
        return cls(entries, tuple(n for n, _ in model.named_parameters()))

    def params_spec(self, shape_of: str = "full") -> ArraySpec:
        if shape_of == "block":
            return {n: ((1,), self.entries[n][1]) for n in self.parameters}
        return {n: self.entries[n] for n in self.parameters}


@dataclass
class RoundReport:
    """What happened in one round, for the metrics file."""

    sampled: int = 0
    accepted: int = 0
    rejected: dict[int, str] = field(default_factory=dict)  # node id -> reason
    skipped: bool = False
    bytes_down: int = 0
    bytes_up: int = 0
    metrics: dict[str, float] = field(default_factory=dict)


class AdaptiveStrategy(Strategy):
    """Base for adaptfl's strategies; `state` is the only thing aggregation changes."""

    def __init__(self, cfg: RunConfig, spec: ModelSpec, state: ServerState) -> None:
        self.cfg = cfg
        self.resolved: Resolved = resolve(cfg)
        self.spec = spec
        self.state = state
        self.report = RoundReport()
        self.num_nodes = 0  # connected nodes at the last sampling
        self.round_stats: dict[str, float] = {}  # extra per-round metrics `aggregate` may set
        self.server_opt = ServerOptimizer(self.resolved.server_opt, ServerHyper(
            eta=self.resolved.eta, server_momentum=cfg.server_momentum,
            server_beta1=cfg.server_beta1, server_beta2=cfg.server_beta2,
            server_tau=cfg.server_tau, b2=cfg.b2, adamom_eps=cfg.adamom_eps))

    # --- hooks ---------------------------------------------------------------------------
    def reply_spec(self) -> dict[str, ArraySpec]:
        return {wire.DELTA: self.spec.entries}

    def payload(self) -> dict[str, Tensors]:
        """Extra ArrayRecords sent next to the model this round (none for FedAvg)."""
        return {}

    def check_reply(self, reply: DecodedReply) -> None:
        """Raise ReplyRejected for a reply that passed decoding but lacks what this rule needs."""

    def aggregate(self, server_round: int, replies: list[DecodedReply], weights: list[float],
                  mean_delta: Tensors) -> ServerState:
        """New state from the accepted replies; must not modify `self.state` in place.

        The model moves by the server optimizer's rule on the mean Δ (`none`: x + mean Δ).
        """
        new = self.state.clone()
        new.model, moments = self.server_opt.step(self.state.model, mean_delta, self.state.extras,
                                                  server_round)
        new.extras.update(moments)
        return new

    # --- sampling and messages -------------------------------------------------------------
    def sample_nodes(self, grid: Grid) -> list[int]:
        nodes = sorted(grid.get_node_ids())
        while len(nodes) < self.cfg.min_replies:
            log.info("waiting for nodes: %d connected, %d needed", len(nodes), self.cfg.min_replies)
            time.sleep(1.0)
            nodes = sorted(grid.get_node_ids())
        self.num_nodes = len(nodes)  # N, for rules that scale by |S|/N (SCAFFOLD, FedDyn)
        count = max(1, round(self.cfg.fraction_train * len(nodes)))
        gen = torch.Generator()
        gen.set_state(self.state.sampling_rng)
        order = torch.randperm(len(nodes), generator=gen)[:count].tolist()
        self.state.sampling_rng = gen.get_state()
        return [nodes[i] for i in sorted(order)]

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        recipe = recipe_for_round(self.cfg, server_round, self.state.run_key).to_config()
        extras = self.payload()
        content = RecordDict({wire.MODEL: arrays, wire.RECIPE: ConfigRecord(recipe)})
        for name, tensors in extras.items():
            content[name] = ArrayRecord(tensors)
        nodes = self.sample_nodes(grid)
        per_message = num_bytes(self.state.model) + sum(num_bytes(t) for t in extras.values())
        self.report = RoundReport(sampled=len(nodes), bytes_down=per_message * len(nodes))
        self._sent = [Message(content=content, dst_node_id=node, message_type=MessageType.TRAIN)
                      for node in nodes]
        return self._sent

    def _sender(self, reply: Message) -> int:
        """The node a reply answers for: Flower reports a vanished node's error as sent by the
        SuperLink, so match the instruction by message id (set by the grid on push) first."""
        node_of = {m.metadata.message_id: m.metadata.dst_node_id
                   for m in getattr(self, "_sent", []) if m.metadata.message_id}
        return node_of.get(reply.metadata.reply_to_message_id, reply.metadata.src_node_id)

    # --- aggregation -------------------------------------------------------------------------
    def _accept(self, replies: Iterable[Message]) -> list[DecodedReply]:
        accepted = []
        max_bytes = int(self.cfg.max_reply_mb * 2**20)
        for msg in replies:
            node = self._sender(msg)
            try:
                decoded = decode_reply(msg, self.reply_spec(), max_bytes)
                self.check_reply(decoded)
            except ReplyRejected as why:
                self.report.rejected[node] = str(why)
                log.warning("round reply from node %s dropped: %s", node, why)
                continue
            self.report.bytes_up += decoded.num_bytes
            accepted.append(decoded)
        # Order by partition id so the float sums do not depend on arrival order.
        return sorted(accepted, key=lambda r: int(r.metrics[wire.PARTITION_ID]))

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        accepted = self._accept(replies)
        self.report.accepted = len(accepted)
        if len(accepted) < self.cfg.min_replies:
            self.report.skipped = True
            log.warning("round %d skipped: %d accepted replies < min-replies=%d; state unchanged",
                        server_round, len(accepted), self.cfg.min_replies)
            return None, MetricRecord(self._metrics({}))
        weights = [float(r.metrics[wire.NUM_EXAMPLES]) if self.cfg.weighting == "examples"
                   else 1.0 for r in accepted]
        deltas = [r.arrays[wire.DELTA] for r in accepted]
        mean_delta = weighted_mean(deltas, weights)
        new_state = self.aggregate(server_round, accepted, weights, mean_delta)
        new_state.server_round = server_round
        self.state = new_state  # the only assignment: a failure above leaves state untouched
        stats = {
            "direction-consistency": direction_consistency(deltas, mean_delta),
            "train-loss": _mean(r.metrics.get(wire.TRAIN_LOSS, 0.0) for r in accepted),
            "pos-ratio": _mean(r.metrics.get(wire.POS_RATIO, 0.0) for r in accepted),
            "top-mass": _mean(r.metrics.get(wire.TOP_MASS, 0.0) for r in accepted),
            **self.round_stats,
        }
        return ArrayRecord(self.state.model), MetricRecord(self._metrics(stats))

    def _metrics(self, stats: Mapping[str, float]) -> dict[str, float]:
        self.report.metrics = {
            **stats,
            "replies-sampled": self.report.sampled,
            "replies-accepted": self.report.accepted,
            "replies-rejected": len(self.report.rejected),
            "bytes-down": self.report.bytes_down,
            "bytes-up": self.report.bytes_up,
        }
        return dict(self.report.metrics)

    # --- evaluation happens centrally on the server (server_app/evaluate.py) ----------------
    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        return []

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]
                           ) -> MetricRecord | None:
        return None

    def summary(self) -> None:
        log.info("%s: %s", type(self).__name__, self.resolved)


def _mean(values: Iterable[float]) -> float:
    items = [float(v) for v in values]
    return sum(items) / len(items) if items else 0.0
