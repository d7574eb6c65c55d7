"""The round loop shared by Flower (a real Grid) and the in-process engine (engine/)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch
from adaptfl.algorithms.config import RunConfig
from adaptfl.algorithms.presets import resolve
from adaptfl.server_app.checkpoint import load_checkpoint, resume_source, save_checkpoint
from adaptfl.server_app.evaluate import evaluate
from adaptfl.server_app.outputs import RunOutputs, results_root
from adaptfl.strategies import STRATEGIES, AdaptiveStrategy, ModelSpec
from adaptfl.strategies.state import ServerState
from adaptfl.workloads import build_task_model, load_task
from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.serverapp import Grid

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
    model = build_task_model(cfg.model, test)
    strategy = STRATEGIES[resolved.server](cfg, ModelSpec.of(model), initial_state(cfg, model))
    return strategy, model


def unanswered_nodes(messages: list[Message], replies: list[Message]) -> list[int]:
    """Sampled nodes with no reply at all: later than round-timeout, or gone without a word.

    Replies are matched to instructions by message id where the transport sets one (Flower
    shows a vanished node's error as sent by the SuperLink), else by sender.
    """
    node_of = {m.metadata.message_id: m.metadata.dst_node_id for m in messages if m.metadata.message_id}
    answered = {node_of.get(r.metadata.reply_to_message_id, r.metadata.src_node_id) for r in replies}
    return sorted({m.metadata.dst_node_id for m in messages} - answered)


def restore_or_start(cfg: RunConfig, strategy: AdaptiveStrategy) -> RunOutputs:
    """Open the results dir; with resume, put the last checkpoint's state and rows back."""
    run_dir = results_root(cfg) / cfg.run_name if cfg.run_name else None
    source = resume_source(cfg, run_dir)
    checkpoint = load_checkpoint(cfg, source) if source is not None else None  # before config.json
    outputs = RunOutputs(cfg)
    if checkpoint is not None:
        strategy.state = checkpoint.state
        outputs.restore(checkpoint.rows)
    return outputs


def run_federated(grid: Grid, cfg: RunConfig) -> Path:
    """Train for `num-server-rounds` rounds; returns the results directory.

    After every round the metrics row, then the whole server state, go to the results dir,
    so `resume=true` can continue from the last complete round (server_app/checkpoint.py).
    """
    strategy, model = build_strategy(cfg)
    _, test = load_task(cfg.task, cfg.data_dir)
    outputs = restore_or_start(cfg, strategy)
    strategy.summary()
    timeout = cfg.round_timeout or None
    for server_round in range(strategy.state.server_round + 1, cfg.num_server_rounds + 1):
        started = time.perf_counter()
        messages = list(strategy.configure_train(server_round, ArrayRecord(strategy.state.model),
                                                 ConfigRecord(), grid))
        replies = list(grid.send_and_receive(messages, timeout=timeout))
        strategy.aggregate_train(server_round, replies)
        strategy.state.server_round = server_round  # complete, even when skipped (min-replies)
        missing = unanswered_nodes(messages, replies)
        if missing:
            log.warning("round %d: no reply from nodes %s within round-timeout=%s s",
                        server_round, missing, cfg.round_timeout or "none")
        model.load_state_dict(strategy.state.model)
        accuracy, loss = evaluate(model, test)
        report = strategy.report
        row = {"round": server_round, "test-accuracy": accuracy, "test-loss": loss,
               **report.metrics, "replies-missing": len(missing), "skipped": report.skipped,
               "seconds": time.perf_counter() - started,
               "rejected": {str(k): v for k, v in report.rejected.items()},
               "missing": [int(n) for n in missing]}
        outputs.record(row)
        save_checkpoint(outputs.dir, strategy.state)
        log.info("round %d: test accuracy %.4f, loss %.4f, %d/%d replies accepted",
                 server_round, accuracy, loss, report.accepted, report.sampled)
    outputs.finish(strategy.state.model)
    return outputs.dir
