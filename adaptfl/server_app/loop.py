"""The round loop shared by Flower (a real Grid) and the in-process engine (engine/).

Unlike Flower's `Strategy.start`, it checkpoints after every round and resumes, evaluates
centrally (and, with fraction-evaluate > 0, on the clients: `evaluate_federated`), and writes the
run's outputs. Everything that can reject the run happens in
`build_run`, before round 1: the config, the task and model, and a preflight of the very client
pipeline a node will run (one local step on the server, its reply checked against the contract).
"""

from __future__ import annotations

import copy
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.serverapp import Grid

from adaptfl.algorithms.config import RunConfig
from adaptfl.algorithms.privacy_checks import check_planned_target, dp_plan, plan_line
from adaptfl.algorithms.sampling import NotEnoughNodes
from adaptfl.client_app.client_state import MemoryStore
from adaptfl.client_app.session import ClientSession
from adaptfl.client_app.train import run_local_steps
from adaptfl.core import wire
from adaptfl.core.contract import ModelSpec, federated_state, frozen_parameters, load_federated
from adaptfl.core.stage import ClientData
from adaptfl.privacy import ledger
from adaptfl.privacy.client import server_dry_run
from adaptfl.privacy.mechanism import metric_domains, reply_domains
from adaptfl.privacy.release import CONFIDENTIAL_FILE, detail_level
from adaptfl.privacy.server import BudgetReached
from adaptfl.secagg.aggregate import secure_round
from adaptfl.server_app.abort import RunAborted, SkipGuard, check_final_model, fell_below_start
from adaptfl.server_app.checkpoint import (
    check_same_job,
    continues_same_job,
    load_checkpoint,
    new_run_key,
    refuse_reuse,
    resume_source,
    save_checkpoint,
)
from adaptfl.server_app.data_summary import summarize, summary_line, write_summary
from adaptfl.server_app.evaluate import evaluate_all, evaluation_device
from adaptfl.server_app.outputs import RunOutputs, results_root
from adaptfl.server_app.progress import Progress
from adaptfl.server_app.run_checks import (
    check_frozen,
    check_model,
    check_nodes,
    check_secure_sample,
    check_settings,
    check_small_rounds,
    partition_sizes,
)
from adaptfl.strategies.base import AdaptiveStrategy
from adaptfl.strategies.contribution import small_round_note, tolerance_note
from adaptfl.strategies.secagg_search import NARROWED
from adaptfl.strategies.validation import ReplyRejected, decode_content, reply_bound
from adaptfl.workloads import Task, build_task_model, load_task

if TYPE_CHECKING:
    from adaptfl.engine.inprocess import InProcessGrid

log = logging.getLogger(__name__)
PREFLIGHT_ROWS = 4  # examples of the test split one preflight step trains on


def build_run(cfg: RunConfig) -> tuple[AdaptiveStrategy, torch.nn.Module, Task]:
    """Strategy, model and task; refuses anything that would fail a client, before round 1."""
    task = load_task(cfg.data.task, cfg.data.data_dir, cfg.data.model, cfg.llm)
    torch.manual_seed(cfg.federation.seed)
    model = build_task_model(cfg.data.model, task, cfg.llm, cfg.data.data_dir)
    strategy = AdaptiveStrategy(cfg)
    if cfg.privacy.on:  # the data this run spends: its per-user dp ledger (privacy/ledger.py)
        strategy.data_key = ledger.data_key(task.name, task.train.labels)
    spec = ModelSpec.of(model)
    strategy.initialize(federated_state(model), spec)
    if cfg.local.batch_size > len(task.train):
        log.warning("batch-size=%d exceeds the %d training examples of the whole task: every "
                    "client step will use its whole partition", cfg.local.batch_size, len(task.train))
    check_model(model, task, cfg.data.model)
    check_settings(cfg, task)
    check_frozen(cfg, spec)
    preflight(strategy, model, task)
    return strategy, model, task


def preflight(strategy: AdaptiveStrategy, model: torch.nn.Module, task: Task) -> None:
    """Run round 1's client pipeline for one step on a copy of the model, and validate its reply
    as the server will: a setting no client can run fails here, with the client's message."""
    content = strategy.instruction(1, ConfigRecord())
    rows = torch.arange(min(PREFLIGHT_ROWS, len(task.test)))
    data = ClientData(num_examples=len(rows), full_batches=lambda: [task.test.batch(rows)],
                      loss=task.loss)
    with torch.random.fork_rng():
        # frozen parameters are shared with the copy, not copied (a pretrained base is large)
        shared = {id(p): p for p in frozen_parameters(model).values()}
        with server_dry_run():  # no node's floor: each node checks its own when asked
            session = ClientSession(content, copy.deepcopy(model, shared), data=data, store=MemoryStore())
        run_local_steps(session, task.test, task.loss, rows, client_id=0, steps=1, warn=False)
        reply = session.reply_content(len(rows), check_steps=False)  # one step of K, on purpose
    contract = strategy.contract()
    assert strategy.spec is not None
    try:
        decode_content(reply, contract.reply_spec(strategy.spec),
                       max_bytes=reply_bound(strategy.cfg.federation.max_reply_mb,
                                             strategy.wire_reply_spec()),
                       required_metrics=contract.up_metrics,
                       domains=reply_domains(contract, strategy.cfg.privacy),
                       metric_domains=metric_domains(contract, strategy.cfg.privacy),
                       codecs=strategy.reply_codecs())
    except ReplyRejected as why:
        raise ValueError(f"{cfg_name(strategy)}: a client's reply would be refused ({why})") from None


def rss_mb() -> float:
    """This process's resident memory now (MiB); in Flower's simulation this process also holds
    every simulated node's context (docs/scale.md). The peak where /proc is missing."""
    try:
        with open("/proc/self/status") as fh:
            kib = next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))
    except (OSError, StopIteration):
        import resource

        kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
        kib = kib // 1024 if sys.platform == "darwin" else kib
    return round(kib / 1024, 1)


def cfg_name(strategy: AdaptiveStrategy) -> str:
    return f"algorithm {strategy.cfg.algorithm.name!r}"


def unanswered_nodes(messages: list[Message], replies: list[Message]) -> list[int]:
    """Sampled nodes with no reply at all: later than round-timeout, or gone without a word.

    Replies are matched to instructions by message id where the transport sets one (Flower
    shows a vanished node's error as sent by the SuperLink), else by sender.
    """
    node_of = {m.metadata.message_id: m.metadata.dst_node_id for m in messages if m.metadata.message_id}
    answered = {node_of.get(r.metadata.reply_to_message_id, r.metadata.src_node_id) for r in replies}
    return sorted({m.metadata.dst_node_id for m in messages} - answered)


def check_results_dir(cfg: RunConfig, check_only: bool = False) -> Path | None:
    """What `restore_or_start` refuses (a run-name in use, a resume without a checkpoint or of
    another job), with `check_only` before Flower starts and writing nothing; returns the
    checkpoint's folder to resume from, or None."""
    run_dir = results_root(cfg) / cfg.output.run_name if cfg.output.run_name else None
    source = resume_source(cfg, run_dir)
    if run_dir is not None and not (source is not None and continues_same_job(source, run_dir)):
        refuse_reuse(cfg, run_dir, may_resume=source is None, check_only=check_only)
    if check_only and source is not None:
        check_same_job(cfg, source)
    return source


def restore_or_start(cfg: RunConfig, strategy: AdaptiveStrategy) -> RunOutputs:
    """Open the results dir; with resume, put the last checkpoint's state and rows back. A dir
    that holds a run already is refused unless resume=true or overwrite=true."""
    source = check_results_dir(cfg)
    checkpoint = load_checkpoint(cfg, source) if source is not None else None  # before config.json
    outputs = RunOutputs(cfg)
    strategy.run_dir = str(outputs.dir)
    if checkpoint is not None:
        strategy.state = checkpoint.state
        if not continues_same_job(source, outputs.dir):  # a fork: its clients' state is its own
            strategy.state.run_key = new_run_key()
    outputs.restore(checkpoint.rows if checkpoint is not None else [])  # only these rounds' rows
    return outputs


def run_federated(grid: Grid, cfg: RunConfig, on_round: Callable[[dict[str, Any]], None] | None = None
                  ) -> Path:
    """Train for `num-server-rounds` rounds; returns the results directory.

    After every round the metrics row, then the whole server state, go to the results dir,
    so `resume=true` can continue from the last complete round (server_app/checkpoint.py).
    Under dp the row is split there (RunOutputs.record, privacy/release.py) and `on_round` gets
    its released part.
    The initial model's evaluation is round 0. `on_round(row)` is called after each round.
    """
    strategy, model, task = build_run(cfg)
    if getattr(grid, "static_nodes", False):  # the nodes are known now: check what needs them
        node_configs = cast("InProcessGrid", grid).node_configs()  # the grid with static_nodes
        check_nodes(cfg, task, node_configs)
        # the partitioning is the server's own here (|D| and the ids the nodes may claim), unless
        # a node trains on data of its own (data-dir): then no partitioning covers the federation
        if not any(wire.NODE_DATA_DIR in c for c in node_configs):
            strategy.partition_sizes = partition_sizes(cfg, task, len(node_configs))
    outputs = restore_or_start(cfg, strategy)
    try:
        train_rounds(grid, cfg, strategy, model, task, outputs, on_round)
    except BaseException as err:  # an abort, an error, an interrupt: the MLflow run says so
        outputs.abort(interrupted=isinstance(err, KeyboardInterrupt))
        if isinstance(err, ValueError):  # refused (app.py: failed_line): no folder blocks the retry
            outputs.discard()
        raise
    return outputs.dir


def train_rounds(grid: Grid, cfg: RunConfig, strategy: AdaptiveStrategy, model: torch.nn.Module,
                 task: Task, outputs: RunOutputs, on_round: Callable[[dict[str, Any]], None] | None) -> None:
    """Round 0 of a fresh run, then the rounds left, then the final model (run_federated)."""
    strategy.summary()
    fed = cfg.federation
    guard = SkipGuard(fed.max_skipped_rounds, outputs.rows, fed.skip_window)
    assert strategy.state is not None
    device = evaluation_device(cfg.runtime.device)  # the run's GPU where this process has it
    if not outputs.rows:  # a fresh run: where training starts from
        scores = evaluate_all(model, task, device)
        outputs.record({"round": 0, **scores})
        log.info("[ROUND 0/%d] the initial model: accuracy %.4f, loss %.4f", fed.num_server_rounds,
                 scores["test-accuracy"], scores["test-loss"])
    first = strategy.state.server_round + 1
    progress = Progress(fed.num_server_rounds, first, on_round)
    for server_round in range(first, fed.num_server_rounds + 1):
        started = time.perf_counter()
        messages = start_round(grid, cfg, strategy, task, outputs, server_round)
        if messages is None:  # dp-on-target='stop': the rounds so far are the run
            break
        missing = exchange(grid, cfg, strategy, server_round, messages)
        strategy.state.server_round = server_round  # complete, even when skipped (min-replies)
        load_federated(model, strategy.state.model)
        federated = evaluate_federated(grid, cfg, strategy, server_round)  # fraction-evaluate
        row = {**round_row(strategy, model, task, server_round, missing, started, device), **federated}
        outputs.record(row)
        save_checkpoint(outputs.dir, strategy.state)
        progress.round_done(outputs.public(row))
        # under dp the abort message names no node and quotes no reply (they are confidential)
        report, private = strategy.report, cfg.privacy.on
        guard.after_round(server_round, report.skipped, report.skip_reason,
                          {} if private else report.rejected, [] if private else missing,
                          narrowed=bool(report.secagg.get(NARROWED)))
    guard.at_end(fed.num_server_rounds)
    check_final_model(strategy.state.model)
    worse = fell_below_start(outputs.rows, CONFIDENTIAL_FILE if cfg.privacy.on else "metrics.jsonl")
    if worse:
        log.warning("%s", worse)
    outputs.finish(strategy.state.model)


def start_round(grid: Grid, cfg: RunConfig, strategy: AdaptiveStrategy, task: Task,
                outputs: RunOutputs, server_round: int) -> list[Message] | None:
    """The round's instructions, not yet sent; None where dp-on-target='stop' ends the run. At
    round 1 the nodes are known, under Flower too: the data summary, and under dp the plan's one
    line (privacy_checks.py), refused past dp-accept-epsilon before anything is sent."""
    assert strategy.state is not None
    try:
        messages = list(strategy.configure_train(server_round, ArrayRecord(strategy.state.model),
                                                 ConfigRecord(), grid))
    except NotEnoughNodes as err:
        raise RunAborted(f"run aborted before round {server_round}: {err}") from None
    except BudgetReached as reached:
        log.warning("%s", reached)
        return None
    if server_round == 1:
        first_round_notes(cfg, strategy, task, outputs, len(messages))
    return messages


def first_round_notes(cfg: RunConfig, strategy: AdaptiveStrategy, task: Task, outputs: RunOutputs,
                      sampled: int) -> None:
    """What round 1 knows before anything is sent, under Flower too: the nodes. The data summary;
    SecAgg+'s and dp's checks (dp's plan in one line, refused past dp-accept-epsilon); what the
    aggregator tolerates and what small rounds leave unbounded."""
    summary = summarize(task, cfg, strategy.num_nodes)
    log.info("%s", summary_line(summary))
    write_summary(summary, outputs.dir, figure=outputs.figures)
    if cfg.secagg.on:
        check_secure_sample(sampled, strategy.num_nodes)
    check_small_rounds(cfg, sampled, strategy.num_nodes)  # refused unless accept-small-rounds
    if cfg.privacy.on:
        check_planned_target(cfg.privacy, cfg.federation, strategy.num_nodes, cfg.algorithm)
        log.info("%s", plan_line(cfg.privacy, dp_plan(cfg.privacy, cfg.algorithm, cfg.federation,
                                                      strategy.num_nodes)))
        if cfg.federation.fraction_evaluate > 0:  # the clients' scores carry no noise
            log.info("fraction-evaluate under dp: the fed-eval columns are not released (%s only)",
                     CONFIDENTIAL_FILE)
    if not (cfg.privacy.on or cfg.secagg.on):  # neither screens nor bounds a reply there
        log.info("%s", tolerance_note(cfg, sampled, strategy.num_nodes))
    small = small_round_note(cfg, sampled, strategy.num_nodes)
    if small:
        log.warning("%s", small)


def exchange(grid: Grid, cfg: RunConfig, strategy: AdaptiveStrategy, server_round: int,
             messages: list[Message]) -> list[int]:
    """Send the round, aggregate what comes back; the sampled nodes that did not reply."""
    fed = cfg.federation
    timeout = fed.round_timeout or None
    if cfg.secagg.on:  # five exchanges; the strategy sees only the sum (secagg/)
        missing = secure_round(strategy, grid, server_round, messages, timeout)[2]
    else:
        replies = list(grid.send_and_receive(messages, timeout=timeout))
        strategy.aggregate_train(server_round, replies)
        missing = unanswered_nodes(messages, replies)
    report, private = strategy.report, cfg.privacy.on
    if private and (missing or report.rejected):  # counts only: who and why are the server's
        log.warning("round %d: %d replies dropped, %d sampled nodes without a reply (which and "
                    "why: %s)", server_round, len(report.rejected), len(missing), CONFIDENTIAL_FILE)
    if missing:
        log.log(detail_level(private), "round %d: no reply from nodes %s within round-timeout=%s s",
                server_round, missing, fed.round_timeout or "none")
    return missing


def evaluate_federated(grid: Grid, cfg: RunConfig, strategy: AdaptiveStrategy, server_round: int
                       ) -> dict[str, Any]:
    """Federated evaluation of the round's global model (strategies/evaluation.py), sent as the
    training messages are, within round-timeout; its columns of the row ({} when
    fraction-evaluate is 0: central evaluation only)."""
    if cfg.federation.fraction_evaluate <= 0:
        return {}
    assert strategy.state is not None
    started = time.perf_counter()
    messages = list(strategy.configure_evaluate(server_round, ArrayRecord(strategy.state.model),
                                                ConfigRecord(), grid))
    replies = list(grid.send_and_receive(messages, timeout=cfg.federation.round_timeout or None)) \
        if messages else []
    strategy.aggregate_evaluate(server_round, replies)
    return strategy.eval_report.row(time.perf_counter() - started)


def round_row(strategy: AdaptiveStrategy, model: torch.nn.Module, task: Task, server_round: int,
              missing: list[int], started: float, device: torch.device | None = None) -> dict[str, Any]:
    """The round's metrics row: central evaluation of the new global model (on `device`) and
    the report."""
    report = strategy.report
    evaluated = time.perf_counter()
    scores = evaluate_all(model, task, device)
    row = {"round": server_round, **scores,
           **report.metrics, "replies-missing": len(missing), "skipped": report.skipped,
           "seconds": time.perf_counter() - started,
           "eval-seconds": time.perf_counter() - evaluated,
           "rejected": dict(report.rejected), "missing": [int(n) for n in missing],
           "latency": {n: round(t, 3) for n, t in report.latency.items()},
           "bytes": {"down": dict(report.down_bytes), "up": dict(report.up_bytes)}}
    if report.skip_reason:
        row["skip-reason"] = report.skip_reason
    ledger_file = ledger.path_of(strategy.cfg.privacy, strategy.data_key)
    if ledger_file is not None:  # which ledger dp-epsilon-ledger is the total of
        row["dp-ledger-file"] = str(ledger_file)
    if report.step_path() is not None:  # which local-step path the clients took
        row[wire.STEP_PATH] = report.step_path()
    if report.clients:
        row["clients"] = report.clients
    row.update(report.secagg)  # the search for a node that sent a sum out of reach
    row["server-rss-mb"] = rss_mb()
    return row
