"""adaptfl's ClientApp: load this node's data and the model, run the recipe, reply.

No per-algorithm branches: the session (session.py) builds everything from the `recipe` record.
A node trains on its partition of the run's data set (node config `partition-id`,
`num-partitions`), or on data of its own when its node config sets `data-dir` (all of it).
Errors a user can fix (a bad setting, a message this client cannot run) come back to the server
as one-line error replies.
"""

from __future__ import annotations

import hashlib
import logging
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import numpy as np
import torch
from flwr.app import ConfigRecord, Context, Error, Message, MessageType, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode

from adaptfl.algorithms.recipe import (
    EVALUATE_STEPS,
    SECURE,
    llm_from_recipe,
    privacy_from_recipe,
    settings_from_recipe,
)
from adaptfl.algorithms.settings import Data
from adaptfl.client_app.client_state import MemoryStore
from adaptfl.client_app.device import peak_memory_mb, reset_peak_memory, select_device
from adaptfl.client_app.session import ClientSession
from adaptfl.client_app.threads import client_threads
from adaptfl.client_app.train import run_local_steps
from adaptfl.core import wire
from adaptfl.core.stage import ClientData
from adaptfl.privacy.client import check_evaluation, node_settings, truthy
from adaptfl.privacy.node_ledger import rows_key
from adaptfl.privacy.release import detail_level
from adaptfl.secagg import client as secagg_client
from adaptfl.workloads import Split, Task, build_task_model, load_task, partition_indices
from adaptfl.workloads.held_out import held_out_rows
from adaptfl.workloads.scoring import score
from adaptfl.workloads.task import Loss

if TYPE_CHECKING:
    from flwr.app.typing import MetricRecordValues

log = logging.getLogger(__name__)
app = ClientApp()


PARTITION_CACHE = "adaptfl-partition"  # context.state key: this node's rows, and what they are of


def _partition(context: Context, data: Data, seed: int, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(this node's rows, a stable client id for its seeds).

    The rows are kept in `context.state` after the first round: a deployed SuperNode starts a
    fresh ClientApp process per message, and the N-way split (flwr-datasets, Arrow tables)
    costs that process seconds and ~200 MB every time (docs/scale.md)."""
    node = context.node_config
    if wire.NODE_DATA_DIR in node:  # the node's own data: all of it
        return torch.arange(len(labels)), int(node.get(wire.NODE_PARTITION_ID, context.node_id))
    if wire.NODE_PARTITION_ID not in node or wire.NODE_NUM_PARTITIONS not in node:
        raise ValueError("node config sets neither data-dir (own data) nor partition-id and "
                         "num-partitions (a share of the run's data set)")
    pid, count = int(node[wire.NODE_PARTITION_ID]), int(node[wire.NODE_NUM_PARTITIONS])
    digest = hashlib.sha256(labels.numpy().tobytes()).hexdigest()[:16]  # the very labels split
    key = (f"{data.task}|{data.data_dir}|{digest}|{data.partitioning}|{count}|{pid}|"
           f"{data.dirichlet_alpha}|{data.classes_per_client}|{seed}")
    cached = context.state.config_records.get(PARTITION_CACHE)
    if cached is not None and cached.get("key") == key:
        rows = np.frombuffer(cast(bytes, cached["rows"]), dtype=np.int64)  # stored as bytes below
        return torch.from_numpy(rows.copy()), pid
    indices = partition_indices(labels, count, pid, data.partitioning, data.dirichlet_alpha, seed,
                                data.classes_per_client)
    context.state[PARTITION_CACHE] = ConfigRecord({"key": key, "rows": indices.astype(np.int64).tobytes()})
    return torch.as_tensor(indices.copy()), pid


def ray_node() -> int | None:
    """The Ray node this ClientApp runs on, when it runs in Flower's simulation (a Ray actor): the
    first 12 hex digits of Ray's node id as an int (48 bits: exact in any metric); else None."""
    ray = sys.modules.get("ray")  # imported by the actor; never imported here for nothing
    if ray is None or not ray.is_initialized():
        return None
    return int(ray.get_runtime_context().get_node_id()[:12], 16)


def first_time(context: Context, warning: str) -> bool:
    """True the first time this client gives `warning` in this run (Flower keeps
    `context.state` across a run's rounds; a new run starts it empty), so a warning that holds
    for the whole run is said once per client, not once per round."""
    given = context.state.config_records.get(wire.WARNED)
    if given is None:
        given = context.state[wire.WARNED] = ConfigRecord()
    if warning in given:
        return False
    given[warning] = True
    return True


@dataclass
class LocalJob:
    """One client's round, set up and not yet trained: what `run_local_steps` (one client) or
    the cohort engine (engine/cohort.py: many at once) trains, and what the reply is made from."""

    session: ClientSession
    split: Split
    loss: Loss
    indices: torch.Tensor  # this client's rows of `split`
    client_id: int
    warn: bool  # say once that batch-size exceeds the rows
    precision: str
    private: bool  # dp is on: the loss line stays out of shared logs
    task: Task | None = None  # the whole task (federated evaluation reads its test split)


def prepare_train(msg: Message, context: Context, evaluating: bool = False) -> LocalJob:
    """Everything of a round's local training but the K steps: the recipe read, this node's
    data and the model loaded, the session (global weights, optimizer, stage parts) built
    (`evaluating`: for federated evaluation's local steps, on a throwaway client state)."""
    recipe = msg.content.config_records.get(wire.RECIPE)
    if recipe is None:
        raise ValueError(f"message lacks the {wire.RECIPE!r} record: not from an adaptfl strategy")
    data, runtime = settings_from_recipe(recipe)
    node = context.node_config
    threads = client_threads(runtime.num_threads)  # 0: the CPUs this client has (threads.py)
    if threads is not None and threads != torch.get_num_threads():
        torch.set_num_threads(threads)
    device = select_device(str(node.get(wire.NODE_DEVICE, runtime.device)))
    llm = llm_from_recipe(recipe)
    data_dir = str(node.get(wire.NODE_DATA_DIR, data.data_dir))
    task = load_task(data.task, data_dir, data.model, llm)
    seed = int(cast(int, recipe["round.seed"]))  # an int, as algorithms/recipe.py writes it
    indices, client_id = _partition(context, data, seed, task.labels)
    model = build_task_model(data.model, task, llm, data_dir)
    split = task.train
    chunk = min(512, task.eval_batch_size)
    batches = lambda: [split.batch(rows) for rows in torch.split(indices, chunk)]  # noqa: E731
    batches_of = lambda positions: [split.batch(rows) for rows in torch.split(indices[positions], chunk)]  # noqa: E731
    client_data = ClientData(num_examples=len(indices), full_batches=batches, loss=task.loss,
                             batches_of=batches_of, sample_seed=client_id)
    reset_peak_memory(device)
    session = ClientSession(msg, model, context=context, data=client_data, device=device,
                            store=MemoryStore() if evaluating else None)
    if session.privacy.dp == "client" and not evaluating:  # booked before it trains
        session.booking.book(rows_key(data.task, task.labels, indices))
    warn = not evaluating and session.info.batch_size > len(indices) and first_time(context, "batch-size")
    return LocalJob(session, split, task.loss, indices, client_id, warn, runtime.precision,
                    privacy_from_recipe(recipe)[0].on, task)


def reply_train(job: LocalJob, peak_mb: float, cohort: tuple[int, str] | None = None) -> Message:
    """The round's reply once its K steps ran (`cohort`: they ran stacked with others' in a
    cohort of that size and gradient form, engine/cohort.py)."""
    session = job.session
    # under dp a client's loss is not for a log the server's console may share (in-process)
    log.log(detail_level(job.private, logging.INFO), "client %d round %d: loss %.4f on %s",
            job.client_id, session.info.server_round, session.train_loss(), session.device)
    metrics: dict[str, int | float] = {wire.PARTITION_ID: job.client_id, wire.PEAK_MEMORY: peak_mb}
    ray = ray_node()
    if ray is not None:
        metrics[wire.RAY_NODE] = ray
    if cohort is not None:
        metrics[wire.COHORT_SIZE] = cohort[0]
    return session.reply(num_examples=len(job.indices), metrics=metrics,
                         batched=None if cohort is None else cohort[1])


def handle_train(msg: Message, context: Context) -> Message:
    """One round of local training as the message's recipe says."""
    job = prepare_train(msg, context)
    run_local_steps(job.session, job.split, job.loss, job.indices, job.client_id, warn=job.warn,
                    precision=job.precision)
    return reply_train(job, peak_memory_mb(job.session.device))


def handle(msg: Message, context: Context) -> Message:
    """A SecAgg+ stage (secagg/client.py, training inside its masked-input stage) or a round's
    plain training. A node whose config sets secagg-required=true trains only inside SecAgg+, so
    a server cannot ask it for its update in the clear; a plain instruction whose own recipe
    names SecAgg+ is refused by every node (the server would get the reply unmasked)."""
    if wire.SECAGG in msg.content.config_records:
        return secagg_client.handle(msg, context, handle_train)
    recipe = msg.content.config_records.get(wire.RECIPE, ConfigRecord())
    required = truthy(node_settings(context.node_config).get(wire.NODE_SECAGG_REQUIRED, ""))
    if recipe.get(SECURE, False) or required:
        raise ValueError("this node replies only inside SecAgg+ (secagg-required, or a recipe naming "
                         "secagg+): a plain training instruction is refused")
    return handle_train(msg, context)


def train_or_refuse(msg: Message, context: Context) -> Message:
    """`handle`, with a setting or message this client cannot run answered in one line."""
    try:
        return handle(msg, context)
    except ValueError as err:
        log.error("round refused: %s", err)
        return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=str(err)), reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    return train_or_refuse(msg, context)


def handle_evaluate(msg: Message, context: Context) -> Message:
    """Federated evaluation (docs/metrics.md): the global model, then the client's locally
    adapted one (the round's optimizer, `evaluate-local-steps` steps or the round's K, on its
    train split), scored on its own held-out rows (workloads/held_out.py; a node with data of
    its own: its whole test split). The steps run on a throwaway client state: the node's durable
    state (SCAFFOLD's c_i, kept optimizer state, error feedback) is neither read nor written."""
    recipe = msg.content.config_records.get(wire.RECIPE)
    if recipe is not None:  # without one prepare_train says so
        check_evaluation(privacy_from_recipe(recipe)[0])
    job = prepare_train(msg, context, evaluating=True)
    task, session = job.task, job.session
    assert task is not None  # prepare_train sets it
    own = wire.NODE_DATA_DIR in context.node_config
    rows = torch.arange(len(task.test)) if own else \
        held_out_rows(task.train.labels, job.indices, task.test.labels, session.info.seed, job.client_id)
    if len(rows) == 0:
        raise ValueError("this node's task has an empty test split: nothing to evaluate on")
    before = score(session.model, task, task.test, rows)
    steps = int(cast(int, msg.content.config_records[wire.RECIPE].get(EVALUATE_STEPS, 0))) or None
    run_local_steps(session, job.split, job.loss, job.indices, job.client_id, steps=steps, warn=False,
                    precision=job.precision)
    after = score(session.model, task, task.test, rows)
    metrics: dict[str, int | float] = {
        wire.NUM_EXAMPLES: len(rows), wire.PARTITION_ID: job.client_id,
        wire.EVAL_LOSS: before["test-loss"], wire.EVAL_ACCURACY: before["test-accuracy"],
        wire.PERSONAL_LOSS: after["test-loss"], wire.PERSONAL_ACCURACY: after["test-accuracy"]}
    log.log(detail_level(job.private, logging.INFO), "client %d round %d: evaluated on %d held-out "
            "rows, accuracy %.4f (personalised %.4f)", job.client_id, session.info.server_round,
            len(rows), before["test-accuracy"], after["test-accuracy"])
    # cast: dict is invariant; its int/float values are MetricRecordValues
    return Message(RecordDict({wire.METRICS: MetricRecord(cast("dict[str, MetricRecordValues]", metrics))}),
                   reply_to=msg)


def evaluate_or_refuse(msg: Message, context: Context) -> Message:
    """`handle_evaluate`, with a setting or message this client cannot run answered in one line."""
    try:
        return handle_evaluate(msg, context)
    except ValueError as err:
        log.error("evaluation refused: %s", err)
        return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=str(err)), reply_to=msg)


def handle_census(msg: Message, context: Context) -> Message:
    """The server's census before round 1 (strategies/census.py): this node's training rows and
    partition id, from the recipe alone (no model, nothing trained)."""
    recipe = msg.content.config_records.get(wire.RECIPE)
    if recipe is None:
        raise ValueError(f"message lacks the {wire.RECIPE!r} record: not from an adaptfl strategy")
    data, _ = settings_from_recipe(recipe)
    task = load_task(data.task, str(context.node_config.get(wire.NODE_DATA_DIR, data.data_dir)), data.model,
                     llm_from_recipe(recipe))
    indices, client_id = _partition(context, data, int(cast(int, recipe["round.seed"])), task.labels)
    metrics = {wire.NUM_EXAMPLES: len(indices), wire.PARTITION_ID: client_id}
    return Message(RecordDict({wire.METRICS: MetricRecord(cast("dict[str, MetricRecordValues]", metrics))}),
                   reply_to=msg)


def census_or_refuse(msg: Message, context: Context) -> Message:
    try:
        return handle_census(msg, context)
    except ValueError as err:
        return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=str(err)), reply_to=msg)


def answer(msg: Message, context: Context) -> Message:
    """What the ClientApp does with a message, by its type (the in-process engine's handler)."""
    if msg.metadata.message_type == MessageType.EVALUATE:
        return evaluate_or_refuse(msg, context)
    if msg.metadata.message_type == MessageType.QUERY:
        return census_or_refuse(msg, context)
    return train_or_refuse(msg, context)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    return evaluate_or_refuse(msg, context)


@app.query()
def census(msg: Message, context: Context) -> Message:
    return census_or_refuse(msg, context)
