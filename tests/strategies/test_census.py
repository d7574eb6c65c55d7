"""HaFedHo's |D| from every node before round 1 (strategies/census.py) on the deployment path
(the server does not hold the partitioning): each connected node answers one QUERY with its
examples before round 1's training, claims capped against each other, so no first claim of
2**62 or of 10× the median sets |D|; a bad census reply is dropped alone; a node is asked
once, a new one when it appears."""

from __future__ import annotations

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, MessageType

from adaptfl.algorithms.config import RunConfig
from adaptfl.core import wire
from adaptfl.core.contract import ModelSpec
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.strategies import HaFedHo
from adaptfl.strategies.examples import ledger_of
from adaptfl.workloads import build_task_model, load_task, partition_indices
from tests.conftest import needs_fashion_mnist
from tests.strategies.test_hafedho import _reply, census_handler

HONEST = 300


def _strategy(**kw) -> HaFedHo:  # noqa: ANN003
    strategy = HaFedHo(RunConfig.of(algorithm="hafedho", lr=0.5, lr_schedule="constant", local_steps=2, **kw))
    strategy.initialize({"w": torch.tensor([1.0, 1.0])}, ModelSpec({"w": ((2,), torch.float32)}, ("w",)))
    return strategy


def _round(strategy: HaFedHo, grid: InProcessGrid, server_round: int, claim: float) -> float:
    """Configure a round, every sampled node replying with `claim` examples: the |D| it sends on."""
    model = ArrayRecord(strategy.state.model)
    sent = list(strategy.configure_train(server_round, model, ConfigRecord(), grid))
    strategy.aggregate_train(server_round, [_reply(m, {"w": [0.1, 0.1]}, int(claim), 0.5) for m in sent])
    assert not strategy.report.skipped, strategy.report.skip_reason
    return float(strategy.state.extras[wire.HAFEDHO_N_TOTAL]["n-total"])


@pytest.mark.parametrize("lie", [2.0**62, 10.0 * HONEST])
@pytest.mark.parametrize("aggregator,cap", [("mean", 10.0), ("median", 1.0)])
def test_a_liar_sampled_first_cannot_set_the_federations_size(lie: float, aggregator: str,
                                                              cap: float) -> None:
    """The liar claims `lie` in the census and in its replies, and is the one node round 1
    samples (fraction 0.2): |D| is the four honest 300s plus its claim capped at
    max-weight-ratio (10) × the median under the mean, at the median under a robust rule, from
    round 1 on. Before: 9.2e18 for 2**62 while fewer than three claims were in, 3,900 for 10×
    kept the whole run."""
    settings = dict(fraction_train=0.2, aggregator=aggregator, min_replies=1)
    probe = _strategy(**settings)
    first = probe.configure_train(1, ArrayRecord(probe.state.model), ConfigRecord(),
                                  InProcessGrid(5, {}, handler=census_handler({})))
    liar = next(iter(first)).metadata.dst_node_id
    claims = {n: lie if n == liar else HONEST for n in range(1, 6)}
    strategy = _strategy(**settings)
    grid = InProcessGrid(5, {}, handler=census_handler(claims))
    sizes = [_round(strategy, grid, r, lie) for r in (1, 2, 3)]
    assert sizes == [4 * HONEST + min(lie, cap * HONEST)] * 3
    assert ledger_of(strategy.state.extras) == {n - 1: float(c) for n, c in claims.items()}  # as claimed


def test_a_bad_census_reply_is_dropped_alone_and_the_round_goes_on() -> None:
    """Node 2 fails the census, node 3 claims NaN, nodes 4 and 5 both claim partition 3: only
    node 1's claim counts (the others as not seen, at its median), and round 1 trains all five."""
    strategy = _strategy()
    handler = census_handler({1: HONEST, 3: float("nan"), 4: HONEST, 5: HONEST}, pids={5: 3})
    grid = InProcessGrid(5, {}, handler=handler)
    sent = list(strategy.configure_train(1, ArrayRecord(strategy.state.model), ConfigRecord(), grid))
    assert len(sent) == 5 and ledger_of(strategy.state.extras) == {0: float(HONEST)}


def test_each_node_is_asked_once_and_a_new_node_when_it_appears() -> None:
    asked: list[int] = []
    claims = census_handler({n: HONEST for n in range(1, 5)})

    def handler(msg, context):  # noqa: ANN001, ANN202
        if msg.metadata.message_type == MessageType.QUERY:
            asked.append(context.node_id)
        return claims(msg, context)

    grid = InProcessGrid(4, {}, handler=handler)
    connected = [[1, 2, 3], [1, 2, 3], [1, 2, 3, 4]]
    grid.get_node_ids = lambda: connected[len(seen) - 1]  # type: ignore[method-assign]
    strategy, seen = _strategy(min_replies=1), []
    for server_round in (1, 2, 3):
        seen.append(server_round)
        _round(strategy, grid, server_round, HONEST)
    assert asked == [1, 2, 3, 4]
    assert float(strategy.state.extras[wire.HAFEDHO_N_TOTAL]["n-total"]) == 4 * HONEST


def test_a_reply_without_a_partition_id_does_not_refuse_the_round() -> None:
    strategy = _strategy()
    grid = InProcessGrid(3, {}, handler=census_handler({1: HONEST, 2: HONEST, 3: HONEST}))
    sent = list(strategy.configure_train(1, ArrayRecord(strategy.state.model), ConfigRecord(), grid))
    replies = [_reply(m, {"w": [0.1, 0.1]}, HONEST, 0.5) for m in sent]
    del replies[0].content.metric_records[wire.METRICS][wire.PARTITION_ID]
    strategy.aggregate_train(1, replies)
    assert not strategy.report.skipped, strategy.report.skip_reason
    assert float(strategy.state.extras[wire.HAFEDHO_N_TOTAL]["n-total"]) == 3 * HONEST


@needs_fashion_mnist
def test_adaptfls_clientapp_answers_the_census_with_its_partition(tiny_data) -> None:  # noqa: ANN001
    """The ClientApp (client_app/app.py `handle_census`) counts the rows of the partition it
    trains on: the census of 4 nodes is the partitioning's own sizes, from the recipe alone."""
    cfg = RunConfig.of(algorithm="hafedho", model="mlp", data_dir=tiny_data["fashion-mnist"], seed=3)
    strategy = HaFedHo(cfg)
    task = load_task("fashion-mnist", tiny_data["fashion-mnist"], "mlp", cfg.llm)
    strategy.initialize(build_task_model("mlp", task, cfg.llm, "").state_dict())
    grid = InProcessGrid(4, cfg.to_flower())
    list(strategy.configure_train(1, ArrayRecord(strategy.state.model), ConfigRecord(), grid))
    data = cfg.data
    sizes = {pid: float(len(partition_indices(task.train.labels, 4, pid, data.partitioning,
                                              data.dirichlet_alpha, 3, data.classes_per_client)))
             for pid in range(4)}
    assert ledger_of(strategy.state.extras) == sizes
