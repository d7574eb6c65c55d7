"""The round of `AdaptiveStrategy` from its accepted replies: the aggregator's combine of Δ
(weights capped at max-weight-share; under dp the Gaussian mean) -> the server optimizer ->
each component's aggregation (through the same combine) -> the new `ServerState`, checked
against its invariants (strategies/invariants.py) and only then replacing the old one. A round
that fails is refused and the state kept (`skipped`, `skip-reason`); extra numeric reply
metrics are averaged and recorded (docs/threat-model.md, "Hostile clients", steps 4-7).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, ParamSpec, TypeVar, cast

import torch
from flwr.app import ArrayRecord, Message, MetricRecord

from adaptfl.algorithms.sampling import hostile_count
from adaptfl.core import wire
from adaptfl.core.stage import Aggregation
from adaptfl.privacy import server as dp
from adaptfl.privacy.release import detail_level, released
from adaptfl.server_rules.aggregate import cap_shares, direction_consistency
from adaptfl.server_rules.aggregators import AggregationRefused, Combine, memory_of
from adaptfl.strategies.broadcast import RoundBroadcast
from adaptfl.strategies.examples import LEDGER, ledger_record, round_examples
from adaptfl.strategies.invariants import InvariantViolated, check_state
from adaptfl.strategies.screen import HISTORY, reference_record
from adaptfl.strategies.skips import SkipGuard
from adaptfl.strategies.state import ServerState
from adaptfl.strategies.validation import DecodedReply

if TYPE_CHECKING:
    from flwr.app.typing import MetricRecordValues

    from adaptfl.privacy.mechanism import GaussianMean

log = logging.getLogger("adaptfl.strategies.base")  # the strategy's logger


P = ParamSpec("P")
R = TypeVar("R")


def on_one_torch_thread(step: Callable[P, R]) -> Callable[P, R]:
    """`step` on one torch thread, the process's count restored after. The server's reply intake
    and aggregation are many short, memory-bound ops on model-sized tensors: a second thread
    gains little, and where others share the CPU torch's threads wait for each other at every
    op. In Flower's simulation the ServerApp has torch's default, a thread per core: there 100
    replies of the `cnn` took 10.6 s to take in and aggregate, against 0.07 s for Flower's
    FedAvg in numpy (docs/scale.md)."""
    @functools.wraps(step)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        before = torch.get_num_threads()
        if before == 1:
            return step(*args, **kwargs)
        torch.set_num_threads(1)
        try:
            return step(*args, **kwargs)
        finally:
            torch.set_num_threads(before)
    return run


class RoundAggregation(RoundBroadcast):
    """The aggregating half of `AdaptiveStrategy`'s round, on its round state (set there)."""

    run_dir: str  # the results folder, where adaptfl's loop writes one (dp-ledger names it)
    skip_guard: SkipGuard | None  # under Flower's start(): aborts as adaptfl's loop does

    def _skip(self, server_round: int, why: str) -> tuple[None, MetricRecord]:
        self.report.skipped, self.report.skip_reason = True, why
        if self.cfg.privacy.on:  # the reason may quote replies: server-confidential.jsonl has it
            log.warning("round %d skipped, state unchanged", server_round)
        log.log(detail_level(self.cfg.privacy.on), "round %d skipped, state unchanged: %s",
                server_round, why)
        # dp='client': the replies that came were released to the server all the same, and a row
        # without ε would tell that (and so whether a node) failed: booked as any round
        booked = self._record_release(self.state, server_round) \
            if self.cfg.privacy.dp == "client" and self.state is not None else {}
        # cast: dict is invariant; its float values are MetricRecordValues
        return None, MetricRecord(cast("dict[str, MetricRecordValues]", self._metrics(booked)))

    @on_one_torch_thread
    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        assert self.state is not None and self.spec is not None
        result = self.aggregate_accepted(server_round, [r for _, r in self._accept(replies, server_round)])
        if self.skip_guard is not None:  # under start(); adaptfl's loop keeps its own guard
            private = self.cfg.privacy.on  # under dp the abort names no node (release.py)
            self.skip_guard.after_round(server_round, self.report.skipped, self.report.skip_reason,
                                        {} if private else self.report.rejected, [])
        return result

    @on_one_torch_thread
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
            if private is not None and private.combined and self.cfg.privacy.dp != "client":
                # noise was drawn: a release all the same (dp='client': _skip books it)
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
        self.keep_model(new)  # model-delta: the one it replaces (broadcast.py)
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

