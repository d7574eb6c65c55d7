"""Settings that no single key's range can refuse, checked before round 1 (docs/robustness.md: each
of these used to "complete" with every round skipped and an untrained model).

Anywhere (build_run):
    a model that cannot read the task's inputs, or whose output width is not Task.num_outputs
    (too wide trains and reports accuracy without a word; too narrow fails deep in the loss)
    classes-per-client above the labels the task has (pathological partitioning)
    an aggregator that needs more replies than min-replies guarantees (Krum: 2f + 3)
    a component that copies the whole model per client, on a model with a frozen base (MOON)

Where the nodes are known before round 1 (the in-process engine: its nodes run here, with
partition ids 0..N-1), also what otherwise fails on every client:
    min-replies (after fraction-train) above the nodes there are
    a device this machine does not have, on more nodes than min-replies can spare
    a partitioning of the N nodes that fails or leaves a client without data

In a Flower deployment those last ones surface as the clients' one-line error replies, and the
run aborts after max-skipped-rounds (server_app/abort.py) naming them. A client too slow for
round-timeout (MimeLite's full-partition gradient on the fortunes corpus: ~7 min per client per
round on a 2-core CPU) is not guessed at here: its rounds time out and the run aborts naming
the timeout, instead of "completing" untrained.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from adaptfl.algorithms.config import RunConfig
from adaptfl.algorithms.privacy_checks import check_planned_target
from adaptfl.algorithms.sampling import fewest_replies, hostile_count, nodes_needed, sample_size
from adaptfl.algorithms.secagg_checks import MIN_SECURE_NODES
from adaptfl.client_app.device import select_device
from adaptfl.client_app.train import autocast_dtype
from adaptfl.core import wire
from adaptfl.core.contract import ModelSpec
from adaptfl.privacy.mechanism import records_noise_multiplier
from adaptfl.privacy.server import count_stddev
from adaptfl.server_rules.aggregators import Aggregator
from adaptfl.server_rules.aggregators.trimmed_mean import TrimmedMean
from adaptfl.strategies.contribution import more_nodes
from adaptfl.workloads import Task, partition_indices


def check_model(model: nn.Module, task: Task, name: str) -> None:
    """The model's output on two test rows must be [..., task.num_outputs] (one line otherwise;
    at least that wide for a model with `pads_vocabulary`, workloads/causal_lm.py); run before
    any step, in eval mode, without touching the model's state or the RNG."""
    x, _ = task.test.batch(torch.arange(min(2, len(task.test))))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), torch.random.fork_rng():
            out = model(x)  # build_run's model is on the CPU
    except Exception as err:  # noqa: BLE001 - whatever a user's model raises, said in one line
        why = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ValueError(f"model={name!r} cannot read task {task.name!r}'s inputs (one example: "
                         f"{tuple(x.shape[1:])}): {why}") from None
    finally:
        model.train(was_training)
    width = out.shape[-1] if torch.is_tensor(out) and out.ndim else None
    padded = getattr(model, "pads_vocabulary", False)  # a language model's rows past the tokenizer
    if width is None or (width < task.num_outputs if padded else width != task.num_outputs):
        got = f"{width} outputs" if width is not None else f"a {type(out).__name__}, not logits"
        raise ValueError(f"model={name!r} gives {got} per prediction but task {task.name!r} has "
                         f"num_outputs={task.num_outputs} (classes or vocabulary): its last layer "
                         f"must be {task.num_outputs} wide")


def check_settings(cfg: RunConfig, task: Task) -> None:
    data = cfg.data
    if data.partitioning == "pathological":
        distinct = len(torch.unique(task.train.labels))
        if data.classes_per_client > distinct:
            raise ValueError(f"invalid classes-per-client={data.classes_per_client}: task "
                             f"{data.task!r} has {distinct} labels to partition by")
    check_tolerance(cfg)


def check_tolerance(cfg: RunConfig) -> None:
    """The aggregator against min-replies and hostile-fraction; a refusal names the settings that
    hold, each accepted as written (the fewest min-replies the rule's own check passes)."""
    fed, rule = cfg.federation, cfg.algorithm.aggregator
    try:
        rule.check_federation(fed.min_replies, hostile_count(fed.hostile_fraction, fed.min_replies))
    except ValueError as why:
        raise ValueError(f"{why}: {tolerant_setting(rule, fed.hostile_fraction)}") from None


def tolerant_setting(rule: Aggregator, fraction: float) -> str:
    """`set <key>=<value> ...` that holds hostile-fraction=`fraction` with `rule`, or with
    trimmed-mean where `rule` holds none (every value derived from the rule's own check)."""
    fewest = fewest_replies(rule.check_federation, fraction)
    if fewest is not None:
        return f"set min-replies={fewest} (or more)"
    fewest = fewest_replies(TrimmedMean().check_federation, fraction)
    if fraction > 0 and fewest is not None:
        return f"set aggregator='trimmed-mean' min-replies={fewest} (or more)"
    return "lower hostile-fraction"


# Terms that keep whole copies of the model on each client: a frozen pretrained base would be
# copied twice per round, and MOON's representation is a classifier's penultimate layer.
COPIES_MODEL = ("moon",)


def check_frozen(cfg: RunConfig, spec: ModelSpec) -> None:
    """What cannot run on a model with frozen parameters (LoRA adapters over a base)."""
    copies = [t.name for t in cfg.algorithm.terms if t.name in COPIES_MODEL]
    if spec.frozen_count and copies:
        raise ValueError(f"term {copies[0]!r} keeps two whole copies of the model per client; it is "
                         f"refused for a model with frozen parameters ({spec.frozen_count:,} frozen "
                         "numbers: a LoRA base)")


def check_secure_sample(sampled: int, num_nodes: int) -> None:
    """SecAgg+ needs 3 or more nodes a round; refused before round 1 (not a round skipped)."""
    if sampled < MIN_SECURE_NODES:
        raise ValueError(f"secagg='secagg+' with {sampled} of {num_nodes} nodes a round: a secure sum "
                         f"needs {MIN_SECURE_NODES} or more (add nodes or raise fraction-train)")


SMALL_ROUND = 3  # below it no round median can bound a reply (strategies/contribution.py)


def check_small_rounds(cfg: RunConfig, sampled: int, num_nodes: int) -> None:
    """Rounds that sample fewer than 3 nodes are refused before round 1 unless accepted by
    name: measured, a hostile reply there cost FedACT up to 0.32 and FedAvg up to 0.11 of accuracy
    (docs/robustness.md, 'Rounds of one and two replies')."""
    if sampled >= SMALL_ROUND or cfg.federation.accept_small_rounds:
        return
    more = f"{more_nodes(num_nodes, SMALL_ROUND)} ({SMALL_ROUND} of {num_nodes} a round)" \
        if num_nodes >= SMALL_ROUND else f"{SMALL_ROUND} or more nodes"
    raise ValueError(f"fraction-train={cfg.federation.fraction_train:g} samples {sampled} of {num_nodes} "
                     "nodes a round: no round median bounds a hostile reply there (measured: up to "
                     f"-0.32 of accuracy at two a round); use {more}, or set accept-small-rounds=true "
                     "to run it as it is (docs/robustness.md, 'Rounds of one and two replies')")


def check_nodes(cfg: RunConfig, task: Task, node_configs: Sequence[Mapping[str, object]]) -> None:
    """The checks that need the nodes (one line each, ValueError); a node config's `device`
    overrides the run config's, as on the node itself."""
    fed, data = cfg.federation, cfg.data
    num_nodes, needed = len(node_configs), nodes_needed(fed)
    if num_nodes < needed:
        raise ValueError(f"min-replies={fed.min_replies} with fraction-train={fed.fraction_train:g} "
                         f"needs {needed} nodes (a round samples {sample_size(fed, num_nodes)} of "
                         f"{num_nodes}): lower min-replies or add nodes")
    if cfg.secagg.on:
        check_secure_sample(sample_size(fed, num_nodes), num_nodes)
    if cfg.privacy.on:  # σ_b defaults to n/20: with the nodes known, the counts' share of z is too
        records_noise_multiplier(cfg.privacy, cfg.algorithm.reply_record_count(),
                                 count_stddev(cfg.privacy, sample_size(fed, num_nodes)))
        if cfg.privacy.dp_num_clients == 0:  # the nodes are the population (privacy/server.py)
            check_planned_target(cfg.privacy, fed, num_nodes, cfg.algorithm)
    check_small_rounds(cfg, sample_size(fed, num_nodes), num_nodes)
    refusals = []
    for node in node_configs:
        try:
            device = select_device(str(node.get(wire.NODE_DEVICE, cfg.runtime.device)))
            autocast_dtype(cfg.runtime.precision, device)  # precision='bf16' needs CUDA
        except ValueError as err:
            refusals.append(str(err))
    if num_nodes - len(refusals) < needed:  # a node or two without it still lets rounds run
        raise ValueError(f"{len(refusals)} of {num_nodes} nodes cannot run: {refusals[0]}")
    sizes = partition_sizes(cfg, task, num_nodes)
    empty = [pid for pid, size in enumerate(sizes) if size == 0]
    if empty:
        raise ValueError(f"partitioning={data.partitioning!r} leaves partitions {empty[:5]} of "
                         f"{num_nodes} without examples; use fewer nodes or another partitioning")


def partition_sizes(cfg: RunConfig, task: Task, num_nodes: int) -> list[int]:
    """The examples of each of the `num_nodes` partitions, as the nodes of the in-process engine
    (partition ids 0..N-1 of the run's partitioning) hold them."""
    data = cfg.data
    return [len(partition_indices(task.train.labels, num_nodes, pid, data.partitioning,
                                  data.dirichlet_alpha, cfg.federation.seed, data.classes_per_client))
            for pid in range(num_nodes)]
