"""`AdaptiveStrategy`: a Flower message-API `Strategy` for any algorithm of the catalog.

Construct it the Flower way, with keywords and the paper's defaults
(`FedACT(fraction_train=0.5, tau=0.3)`), or from a run config (`AdaptiveStrategy(cfg)`); use it in
your own ServerApp with `strategy.start(grid=..., initial_arrays=..., num_rounds=...)` or in
adaptfl's resumable round loop (server_app/loop.py).

A round: sample nodes (seeded, the RNG in the state; under dp from OS entropy), send each the
model (`arrays`), the `recipe`, the `config` (Flower's train_config + "server-round") and the
records the algorithm's components send (broadcast.py); validate every reply against the
algorithm's contract (records, shapes, dtypes, values within each record's domain, size, one
reply per sampled node, sent by that node, a partition id its node holds) and drop a bad one
with its reason (anything that fails to decode too: no reply can raise into the round;
intake.py); then the aggregator's combine of Δ (weights capped at max-weight-share) -> server
optimizer -> each component's aggregation (through the same combine) -> the new `ServerState`,
checked against its invariants (invariants.py) and only then replacing the old one; a round
that fails is refused and the state kept (aggregation.py). Extra numeric reply metrics are
averaged and recorded. Evaluation is central (server_app/evaluate.py or Flower's evaluate_fn),
and with fraction-evaluate > 0 federated too (evaluation.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from adaptfl.algorithms.config import RunConfig
from adaptfl.algorithms.settings import SETTINGS
from adaptfl.codec.settings import check_domains
from adaptfl.codec.versions import Versions
from adaptfl.core.contract import Contract, ModelSpec
from adaptfl.core.params import fields_of
from adaptfl.strategies.aggregation import RoundAggregation
from adaptfl.strategies.evaluation import EvaluationReport, FederatedEvaluation
from adaptfl.strategies.ownership import Ownership
from adaptfl.strategies.skips import SkipGuard
from adaptfl.strategies.state import RoundReport, ServerState

log = logging.getLogger(__name__)  # intake.py, broadcast.py, aggregation.py log here too


class AdaptiveStrategy(RoundAggregation, FederatedEvaluation, Strategy):
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
        self.announced: Versions = {}  # this round's version of each record (codec/versions.py)
        self._connected: set[int] = set()  # nodes connected at the last sampling
        self._censused: set[int] = set()  # nodes asked their examples (census.py)
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
              evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None) -> Result:
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

    def summary(self) -> None:
        log.info("%s: %s", type(self).__name__, self.cfg.algorithm.describe())
