"""`AdaptiveStrategy`: a Flower message-API `Strategy` for any algorithm of the catalog.

Construct it the Flower way, with keywords and the paper's defaults
(`FedACT(fraction_train=0.5, tau=0.3)`), or from a run config (`AdaptiveStrategy(cfg)`); use it in
your own ServerApp with `strategy.start(grid=..., initial_arrays=..., num_rounds=...)` or in
adaptfl's resumable round loop (server_app/loop.py).

A round: sample nodes (seeded, the RNG in the state; under dp from OS entropy), send each the
model (`arrays`), the `recipe`, the `config` (Flower's train_config + "server-round") and the
records the algorithm's components send; validate every reply against the algorithm's contract
(records, shapes, dtypes, values within each record's domain, size, one reply per sampled node,
sent by that node, a partition id its node holds) and drop a bad one with its reason (anything
that fails to decode too: no reply can raise into the round; strategies/intake.py); then the
aggregator's combine of Δ (weights capped at max-weight-share) -> server optimizer -> each
component's aggregation (through the same combine) -> the new `ServerState`, checked against its
invariants (strategies/invariants.py) and only then replacing the old one; a round that fails is
refused and the state kept. Extra numeric reply metrics are averaged and recorded. Evaluation
is central (server_app/evaluate.py or Flower's evaluate_fn), and with fraction-evaluate > 0
federated too (evaluation.py).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, cast

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from adaptfl.algorithms.config import RunConfig
from adaptfl.algorithms.recipe import FROZEN_DIGEST, to_recipe
from adaptfl.algorithms.sampling import hostile_count, sample_size, secret_sample, wait_for_nodes
from adaptfl.algorithms.settings import SETTINGS
from adaptfl.codec.codec import spec_bytes, wire_bytes
from adaptfl.codec.settings import check_domains
from adaptfl.core import wire
from adaptfl.core.contract import Contract, ModelSpec
from adaptfl.core.params import fields_of
from adaptfl.core.stage import Aggregation, RoundInfo
from adaptfl.privacy import server as dp
from adaptfl.privacy.release import detail_level, released
from adaptfl.server_rules.aggregate import cap_shares, direction_consistency
from adaptfl.server_rules.aggregators import AggregationRefused, Combine, memory_of
from adaptfl.strategies.evaluation import EvaluationReport, FederatedEvaluation
from adaptfl.strategies.examples import LEDGER, ledger_record, round_examples
from adaptfl.strategies.intake import ReplyIntake
from adaptfl.strategies.invariants import InvariantViolated, check_state
from adaptfl.strategies.ownership import Ownership
from adaptfl.strategies.screen import HISTORY, reference_record
from adaptfl.strategies.skips import SkipGuard
from adaptfl.strategies.state import RoundReport, ServerState, Tensors
from adaptfl.strategies.train_config import refuse_adaptfl_keys, train_config_lr, with_lr
from adaptfl.strategies.validation import DecodedReply

if TYPE_CHECKING:
    from flwr.app.typing import MetricRecordValues

    from adaptfl.privacy.mechanism import GaussianMean

log = logging.getLogger(__name__)  # strategies/intake.py logs here too


class AdaptiveStrategy(ReplyIntake, FederatedEvaluation, Strategy):
    """The strategy of every adaptfl algorithm; named subclasses only pick `algorithm`."""

    algorithm: str = "fedavg"

    def __init__(self, config: RunConfig | None = None, *, model: torch.nn.Module | None = None,
                 **hyperparameters: Any) -> None:
        """`config`: a full run config; else keyword hyperparameters (snake_case run-config
        keys: fraction_train, rho, tau, …) over this algorithm's defaults. `model` tells which
        state_dict entries are trainable (else every floating entry counts as trainable)."""
        if config is None:
            config = RunConfig.of(algorithm=self.algorithm, **hyperparameters)
        elif hyperparameters:
            config = config.replace(**hyperparameters)
        self.cfg = config
        self.spec: ModelSpec | None = ModelSpec.of(model) if model is not None else None
        self.state: ServerState | None = None
        self.report = RoundReport()
        self.train_lr: dict[int, float] = {}  # round -> the lr its train config gave
        self.num_nodes = 0  # connected nodes at the last sampling
        # each partition's examples where the server knows the partitioning (the in-process
        # engine): HaFedHo's |D|, and the partition ids a reply may claim; None: a deployment's
        self.partition_sizes: list[int] | None = None
        self.run_dir = ""  # the results folder, where adaptfl's loop writes one (dp-ledger names it)
        self.data_key = ""  # the data's identity: its per-user dp ledger (privacy/ledger.py)
        self._messages: list[Message] = []  # this round's instructions, one per sampled node
        self._connected: set[int] = set()  # nodes connected at the last sampling
        self.screen_reference: dict[str, list[float]] = {}  # set by _screen each round
        self.ownership_next = Ownership()  # set by _bind each round
        self.skip_guard: SkipGuard | None = None  # under Flower's start(): aborts as adaptfl's loop does
        self.eval_report = EvaluationReport()  # the round's federated evaluation (evaluation.py)
        self._eval_messages: list[Message] = []  # this round's EVALUATE messages

    # --- state ----------------------------------------------------------------------------------
    def initialize(self, arrays: Mapping[str, torch.Tensor], spec: ModelSpec | None = None) -> None:
        """Start from these weights (round 0); entries the spec leaves out (a model's frozen
        parameters) are not federated and are dropped here."""
        self.spec = spec or self.spec or ModelSpec.of_arrays(arrays)
        lacking = sorted(set(self.spec.entries) - set(arrays))
        if lacking:
            raise ValueError(f"initial arrays lack the model's entries {lacking[:3]}")
        self.state = ServerState(
            server_round=0, model={n: t.detach().clone() for n, t in arrays.items()
                                   if n in self.spec.entries},
            sampling_rng=torch.Generator().manual_seed(self.cfg.federation.seed).get_state())
        check_domains(self.cfg.compression, self.contract().domains)  # before round 1

    def contract(self, server_round: int | None = None) -> Contract:
        """The algorithm's contract; with `server_round`, the replies of that round (v-sync-every)."""
        assert self.spec is not None, "initialize() first"
        return self.cfg.algorithm.contract(self.spec, server_round)

    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3,
              timeout: float = 3600, train_config: ConfigRecord | None = None,
              evaluate_config: ConfigRecord | None = None, evaluate_fn: Any = None) -> Result:
        """Flower's `Strategy.start`; the lr schedule runs over `num_rounds`. Evaluation is
        central (`evaluate_fn`), and with fraction_evaluate > 0 federated too (evaluation.py,
        `evaluate_config` going to the clients as `config`); without it an `evaluate_config`
        would go unread, so it is refused."""
        self.refuse_loop_only_settings()
        if evaluate_config and self.cfg.federation.fraction_evaluate <= 0:
            raise ValueError("evaluate_config: no evaluate message is sent unless fraction_evaluate > 0 "
                             f"({type(self).__name__}(fraction_evaluate=...)), so no client would read it")
        if num_rounds != self.cfg.federation.num_server_rounds:
            self.cfg = self.cfg.replace(num_server_rounds=num_rounds)
        self.initialize(initial_arrays.to_torch_state_dict())
        fed = self.cfg.federation
        # a round without replies (every client failed, none answered) is skipped, and too many
        # skipped rounds abort the run (RunAborted), as in adaptfl's own loop (server_app/abort.py)
        self.skip_guard = SkipGuard(fed.max_skipped_rounds, window=fed.skip_window)
        try:
            result = super().start(grid, initial_arrays, num_rounds, timeout, train_config,
                                   evaluate_config, evaluate_fn)
            self.skip_guard.at_end(num_rounds)
        finally:
            self.skip_guard = None
        return result

    def refuse_loop_only_settings(self) -> None:
        """Settings only adaptfl's own round loop reads (results, resume, round-timeout, …) would
        be ignored by Flower's `start`: refuse them, naming what to use there instead."""
        defaults = RunConfig.of(algorithm=self.cfg.algorithm.name).to_flower()
        ours = self.cfg.to_flower()
        ignored = [f"{info.key.replace('-', '_')} ({info.param.loop_only})" for s in SETTINGS
                   for info in fields_of(s) if info.param.loop_only and ours[info.key] != defaults[info.key]]
        if ignored:
            raise ValueError(f"{', '.join(ignored)}: read by adaptfl's own ServerApp loop, not by "
                             "Flower's Strategy.start")

    # --- sampling and messages --------------------------------------------------------------------
    def sample_nodes(self, grid: Grid) -> list[int]:
        assert self.state is not None
        fed = self.cfg.federation
        nodes = wait_for_nodes(grid, fed)
        self.num_nodes = len(nodes)  # N, for rules that scale by |S|/N (SCAFFOLD, FedDyn)
        self._connected = set(nodes)
        count = sample_size(fed, len(nodes))
        if self.cfg.privacy.on:  # amplification by sampling needs a sample nobody can recompute
            return sorted(secret_sample(nodes, count))
        gen = torch.Generator()
        gen.set_state(self.state.sampling_rng)
        order = torch.randperm(len(nodes), generator=gen)[:count].tolist()
        self.state.sampling_rng = gen.get_state()
        return [nodes[i] for i in sorted(order)]

    def payload(self) -> dict[str, Tensors]:
        """The records the algorithm's components send this round (all in its contract)."""
        assert self.state is not None and self.spec is not None
        algorithm, out = self.cfg.algorithm, {}
        for stage in algorithm.stages():
            out.update(stage.payload(self.state.extras, self.spec, algorithm))
        undeclared = sorted(set(out) - set(self.contract().down))
        if undeclared:  # a component sending what it did not declare is a bug, not a choice
            raise RuntimeError(f"records {undeclared} are sent but not in {algorithm.name}'s contract")
        return out

    def round_info(self, server_round: int, train_lr: float | None = None) -> RoundInfo:
        """The round's values (`.lr`: its effective lr): the run's schedule, or the lr the train
        config gave this round (round_lr.py), kept for the round's aggregation."""
        assert self.state is not None
        if train_lr is not None:
            self.train_lr = {server_round: train_lr}
        info = self.cfg.round_info(server_round, self.state.run_key)
        given = self.train_lr.get(server_round)
        return info if given is None else with_lr(info, given, self.cfg.lr)

    def instruction(self, server_round: int, config: ConfigRecord | None = None,
                    sampled: int = 1) -> RecordDict:
        """The round's message content, the same for every sampled node (`sampled` of them)."""
        assert self.state is not None
        cfg = self.cfg
        info = self.round_info(server_round, train_config_lr(config or {}))
        recipe = to_recipe(cfg.algorithm, info, cfg.data, cfg.runtime, cfg.output.client_state_dir,
                           cfg.output.client_state_memory, cfg.llm,
                           cfg.privacy, sampled, cfg.compression, cfg.secagg.on)
        if self.spec is not None and self.spec.frozen_digest:
            recipe[FROZEN_DIGEST] = self.spec.frozen_digest
        refuse_adaptfl_keys(config or {}, type(self).__name__)
        train_config = ConfigRecord(dict(config or {}))
        train_config["server-round"] = server_round  # as Flower's FedAvg does
        content = RecordDict({wire.ARRAYS: ArrayRecord(self.state.model), wire.RECIPE: ConfigRecord(recipe),
                              wire.CONFIG: train_config})
        compression = cfg.compression.for_round(server_round)  # codec-warmup: dense in rounds 1..R
        if self.state.server_round < cfg.compression.codec_warmup < server_round:
            self._as_broadcast(self.state, server_round)  # rounds skipped across the warm-up's end
        for name, tensors in self.payload().items():  # as committed: re-encoding gives the same codes
            content[name] = ArrayRecord(compression.of(name).encode(tensors, compression.codec_block))
        return content

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        if self.state is None:
            self.initialize(arrays.to_torch_state_dict())
        nodes = self.sample_nodes(grid)
        assert self.state is not None
        dp.before_round(self.cfg.privacy, self.state, server_round, self.cfg.federation.num_server_rounds,
                        len(nodes), self.num_nodes, self.contract(),
                        self.cfg.federation.min_replies, self.data_key)  # refused: nothing is sent
        content = self.instruction(server_round, config, len(nodes))
        self.report = RoundReport(sampled=len(nodes), lr=self.round_info(server_round).lr)
        if self.cfg.compression.codec_warmup:  # the row says which codecs ran
            self.report.codec_warmup = server_round <= self.cfg.compression.codec_warmup
        self._count_down(content, len(nodes))
        messages = [Message(content=content, dst_node_id=node, message_type=MessageType.TRAIN)
                    for node in nodes]
        self._messages = messages
        return messages

    def _count_down(self, content: RecordDict, nodes: int) -> None:
        """The round's bytes down, by record as they go over the wire, and at fp32."""
        assert self.state is not None
        raw = {wire.ARRAYS: self.state.model, **self.payload()}
        for name, record in content.array_records.items():
            self.report.down_bytes[name] = nodes * wire_bytes(record)
            self.report.fp32_bytes += nodes * spec_bytes({n: (tuple(t.shape), t.dtype)
                                                          for n, t in raw[name].items()})
        self.report.bytes_down = sum(self.report.down_bytes.values())

    # --- aggregation -------------------------------------------------------------------------------
    def _skip(self, server_round: int, why: str) -> tuple[None, MetricRecord]:
        self.report.skipped, self.report.skip_reason = True, why
        if self.cfg.privacy.on:  # the reason may quote replies: server-confidential.jsonl has it
            log.warning("round %d skipped, state unchanged", server_round)
        log.log(detail_level(self.cfg.privacy.on), "round %d skipped, state unchanged: %s",
                server_round, why)
        # cast: dict is invariant; its float values are MetricRecordValues
        return None, MetricRecord(cast("dict[str, MetricRecordValues]", self._metrics({})))

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        assert self.state is not None and self.spec is not None
        result = self.aggregate_accepted(server_round, [r for _, r in self._accept(replies, server_round)])
        if self.skip_guard is not None:  # under start(); adaptfl's loop keeps its own guard
            private = self.cfg.privacy.on  # under dp the abort names no node (release.py)
            self.skip_guard.after_round(server_round, self.report.skipped, self.report.skip_reason,
                                        {} if private else self.report.rejected, [])
        return result

    def aggregate_accepted(self, server_round: int, accepted: list[DecodedReply], secure: bool = False
                           ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The round from its accepted replies; `secure`: each is the SecAgg+ mean (secagg/
        aggregate.py), so per-reply statistics (direction consistency) say nothing."""
        assert self.state is not None and self.spec is not None
        self.report.accepted = len(accepted)
        too_few = self._too_few(accepted)
        if too_few:
            return self._skip(server_round, too_few)
        fed = self.cfg.federation
        claimed, bounded = self._claims(accepted, capped=False), self._claims(accepted)
        weights = cap_shares(bounded, fed.max_weight_share)
        combine, private = self._round_combine(accepted, weights, server_round)
        try:
            new, agg = self._next_state(server_round, accepted, weights, combine)
        except (AggregationRefused, InvariantViolated) as why:
            if private is not None and private.combined:  # noise was drawn: a release all the same
                self._record_release(self.state, server_round)
            return self._skip(server_round, f"round refused: {why}")
        privacy_stats = self._record_release(new, server_round) if private is not None else {}
        self.state = new  # the only assignment: a failure above leaves the state untouched
        deltas = [r.arrays[wire.DELTA] for r in accepted]
        consistency = {} if secure else \
            {"direction-consistency": direction_consistency(deltas, agg.mean_delta)}
        stats = {**consistency, **self._client_metrics(accepted, weights), **agg.stats, **combine.stats,
                 **privacy_stats}
        if self.report.clipped:
            stats["replies-clipped"] = float(self.report.clipped)
        if weights != claimed:  # replies whose claim was above max-weight-ratio or -share
            stats["weights-capped"] = float(sum(b < c or b / sum(bounded) > fed.max_weight_share
                                                for b, c in zip(bounded, claimed, strict=True)))
        return ArrayRecord(self.state.model), \
            MetricRecord(cast("dict[str, MetricRecordValues]", self._metrics(stats)))  # as in _skip

    def _too_few(self, accepted: list[DecodedReply]) -> str:
        """Why the round cannot aggregate ('' if it can): min-replies answered, one accepted;
        under dp='client' min-replies accepted, the least noise shares a target is checked with
        (privacy/server.py `worst_multiplier`)."""
        answered, need = self.report.answered, self.cfg.federation.min_replies
        if answered < need:
            return f"{answered} replies < min-replies={need} ({len(accepted)} accepted)"
        if self.cfg.privacy.dp == "client" and len(accepted) < need:
            return f"{len(accepted)} accepted replies < min-replies={need} (dp='client': their noise)"
        return "" if accepted else f"0 accepted replies of {answered}"

    def _round_combine(self, accepted: list[DecodedReply], weights: list[float], server_round: int
                       ) -> tuple[Combine, GaussianMean | None]:
        """How this round combines every record: the aggregator, or under dp the Gaussian mean
        that clips and noises each shared record (returned too, to account its release)."""
        assert self.state is not None
        fed, contract = self.cfg.federation, self.contract()
        memory = memory_of(self.state.extras)
        private = dp.round_combine(self.cfg.privacy, fed, contract, len(accepted), self.report.sampled,
                                   server_round) if self.cfg.privacy.on else None
        combine = Combine(private or self.cfg.algorithm.aggregator, weights, contract.domains, memory,
                          new_memory={k: dict(v) for k, v in memory.items()},
                          hostile=hostile_count(fed.hostile_fraction, self.report.sampled)
                          if fed.hostile_fraction > 0 else None,
                          set_aside=self.report.answered - len(accepted))
        return combine, private

    def _next_state(self, server_round: int, accepted: list[DecodedReply], weights: list[float],
                    combine: Combine) -> tuple[ServerState, Aggregation]:
        """The state after this round (a copy: raises AggregationRefused or InvariantViolated
        and leaves the current one untouched)."""
        assert self.state is not None and self.spec is not None
        algorithm = self.cfg.algorithm
        mean_delta = combine([r.arrays[wire.DELTA] for r in accepted], wire.DELTA)
        examples, ledger = self._examples(accepted)
        model, moments = algorithm.server_opt.step(self.state.model, mean_delta, self.state.extras,
                                                   server_round)
        agg = Aggregation(server_round, self.round_info(server_round),
                          self.spec, algorithm, self.state.extras, accepted, weights, mean_delta,
                          model, self.num_nodes, combine,
                          federation_examples=examples)
        for stage in algorithm.stages():
            stage.aggregate(agg)
        new = self.state.clone()
        new.server_round, new.model = server_round, agg.model
        new.extras.update({**moments, **agg.new_extras, **combine.slots()})
        if ledger:  # each client's examples, counted once over the run (examples.py)
            new.extras[LEDGER] = ledger_record(ledger)
        self._as_broadcast(new, server_round + 1)
        if self.screen_reference:  # for the next lone reply (screen.py)
            new.extras[HISTORY] = reference_record(self.screen_reference)
        new.ownership = self.ownership_next  # the round's partition claims (ownership.py)
        check_state(new, self.contract(), algorithm)
        return new, agg

    def _examples(self, accepted: list[DecodedReply]) -> tuple[float, dict[int, float] | None]:
        """|D| for the round's Aggregation, and the claims ledger to commit (examples.py)."""
        assert self.state is not None
        counts = any(stage.counts_examples() for stage in self.cfg.algorithm.stages())
        # each claim capped as _claims caps a weight; under a robust rule at the median itself
        ratio = 1.0 if self.cfg.algorithm.aggregator.robust else \
            0.0 if self.cfg.privacy.on else self.cfg.federation.max_weight_ratio
        return round_examples(self.state.extras, [r.metrics for r in accepted], self.partition_sizes,
                              counts, self.num_nodes, ratio)

    def _as_broadcast(self, state: ServerState, next_round: int) -> None:
        """The records the server sends in `next_round`, as its codecs deliver them: the server
        keeps what its clients decode, bit for bit (values whose re-encoding decodes to
        themselves: Codec.settled; so a kept record, v̄ in a round without v, settles to itself)."""
        server_round = state.server_round
        compression = self.cfg.compression.for_round(next_round)  # codec-warmup ends at a round
        for name in self.contract().down:
            codec = compression.of(name)
            if not codec.lossless and name in state.extras:
                generator = compression.generator(self.cfg.federation.seed, server_round, "server", name)
                state.extras[name] = codec.settled(state.extras[name], compression.codec_block, generator)

    def _record_release(self, state: ServerState, server_round: int) -> dict[str, float]:
        return dp.record_release(self.cfg.privacy, state, self.report.sampled, self.num_nodes,
                                 server_round, self.run_dir or self.cfg.output.run_name,
                                 self.cfg.federation.min_replies, self.data_key)

    @staticmethod
    def _client_metrics(replies: list[DecodedReply], weights: list[float]) -> dict[str, float]:
        """Weighted means of the clients' numeric metrics over the replies that report each
        (a metric no client reports is absent, never a fake 0); the peak memory and the cohort
        size are the largest."""
        largest = (wire.PEAK_MEMORY, wire.COHORT_SIZE)
        skip = {wire.NUM_EXAMPLES, wire.PARTITION_ID, wire.CLIENT_STATE, wire.RAY_NODE,
                wire.STEP_PATH, *largest}  # codes and ids: no mean
        keys = sorted({k for r in replies for k in r.metrics} - skip)
        out = {}
        for key in largest:
            values = [float(r.metrics[key]) for r in replies if key in r.metrics]
            if values:
                out[key] = max(values)
        for key in keys:
            pairs = [(float(r.metrics[key]), w) for r, w in zip(replies, weights, strict=True)
                     if key in r.metrics]
            out[key] = sum(v * w for v, w in pairs) / sum(w for _, w in pairs)
        return out

    def _metrics(self, stats: Mapping[str, float]) -> dict[str, float]:
        self.report.metrics = {
            **stats,
            "replies-sampled": self.report.sampled,
            "replies-accepted": self.report.accepted,
            "replies-rejected": len(self.report.rejected),
            "replies-screened": self.report.screened,
            "screen-ratio-max": self.report.screen_ratio_max,
            "latency-max": max(self.report.latency.values(), default=0.0),
            "bytes-down": self.report.bytes_down,
            "bytes-up": self.report.bytes_up,
        }
        if self.report.lr:  # the round's effective lr (schedule or train config)
            self.report.metrics["lr"] = self.report.lr
        if self.report.codec_warmup is not None:
            self.report.metrics["codec-warmup"] = float(self.report.codec_warmup)
        wire_bytes = self.report.bytes_down + self.report.bytes_up
        if wire_bytes and not self.cfg.compression.lossless:
            self.report.metrics["compression-ratio"] = self.report.fp32_bytes / wire_bytes
        # what Flower's Strategy.start logs and keeps: under dp the whitelist (privacy/release.py)
        return released(self.report.metrics) if self.cfg.privacy.on else dict(self.report.metrics)

    def summary(self) -> None:
        log.info("%s: %s", type(self).__name__, self.cfg.algorithm.describe())
