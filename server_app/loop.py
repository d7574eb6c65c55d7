"""The round loop shared by Flower (a real Grid) and the in-process engine (engine/)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord
from flwr.serverapp import Grid

from algorithms.config import RunConfig
from algorithms.presets import resolve
from server_app.evaluate import evaluate
from server_app.outputs import RunOutputs
from strategies import STRATEGIES, AdaptiveStrategy, ModelSpec
from strategies.state import ServerState
from workloads import build_model, load_task

log = logging.getLogger(__name__)


def initial_state(cfg: RunConfig, model: torch.nn.Module) -> ServerState:
    return ServerState(server_round=0,
                       model={n: t.detach().clone() for n, t in model.state_dict().items()},
                       sampling_rng=torch.Generator().manual_seed(cfg.seed).get_state())


def build_strategy(cfg: RunConfig) -> tuple[AdaptiveStrategy, torch.nn.Module]:
    """Everything that can reject the config happens here, before round 1."""
    resolved = resolve(cfg)
    _, test = load_task(cfg.task, cfg.data_dir)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, test.num_classes, test.images.shape[1], test.images.shape[2])
    strategy = STRATEGIES[resolved.server](cfg, ModelSpec.of(model), initial_state(cfg, model))
    return strategy, model


def run_federated(grid: Grid, cfg: RunConfig) -> Path:
    """Train for `num-server-rounds` rounds; returns the results directory."""
    strategy, model = build_strategy(cfg)
    _, test = load_task(cfg.task, cfg.data_dir)
    outputs = RunOutputs(cfg)
    strategy.summary()
    timeout = cfg.round_timeout or None
    for server_round in range(strategy.state.server_round + 1, cfg.num_server_rounds + 1):
        started = time.perf_counter()
        messages = strategy.configure_train(server_round, ArrayRecord(strategy.state.model),
                                            ConfigRecord(), grid)
        replies = grid.send_and_receive(messages, timeout=timeout)
        strategy.aggregate_train(server_round, replies)
        model.load_state_dict(strategy.state.model)
        accuracy, loss = evaluate(model, test)
        report = strategy.report
        row = {"round": server_round, "test-accuracy": accuracy, "test-loss": loss,
               **report.metrics, "skipped": report.skipped,
               "seconds": time.perf_counter() - started,
               "rejected": {str(k): v for k, v in report.rejected.items()}}
        outputs.record(row)
        log.info("round %d: test accuracy %.4f, loss %.4f, %d/%d replies accepted",
                 server_round, accuracy, loss, report.accepted, report.sampled)
    outputs.finish(strategy.state.model)
    return outputs.dir
