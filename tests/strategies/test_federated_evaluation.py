"""Federated evaluation on the strategy (strategies/evaluation.py): hand-built evaluate replies,
their aggregate against a hand computation (weighted mean by examples, worst decile), the bad
ones dropped with a reason, the sample, and Flower's `Strategy.start` sending evaluate messages."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Error, Message, MessageType, MetricRecord, RecordDict

from adaptfl.algorithms.config import RunConfig
from adaptfl.algorithms.recipe import EVALUATE_STEPS
from adaptfl.core import wire
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.strategies import AdaptiveStrategy, FedACT, FedAvg
from adaptfl.strategies.evaluation import evaluation_sample, worst_decile
from tests.strategies.test_strategies import MODEL, SPEC, _configure

GRID5 = InProcessGrid(5, {})


def _strategy(**kw) -> AdaptiveStrategy:
    base = dict(algorithm="fedact", local_steps=2, lr=0.5, lr_schedule="constant", num_server_rounds=3,
                fraction_evaluate=1.0)
    strategy = AdaptiveStrategy(RunConfig.of(**{**base, **kw}))
    strategy.initialize(MODEL, SPEC)
    return strategy


def _evaluate(strategy: AdaptiveStrategy, grid: InProcessGrid = GRID5) -> dict[int, Message]:
    messages = strategy.configure_evaluate(1, ArrayRecord(strategy.state.model), ConfigRecord(), grid)
    return {m.metadata.dst_node_id: m for m in messages}


def _scores(to: Message, **metrics: float) -> Message:
    return Message(RecordDict({wire.METRICS: MetricRecord(metrics)}), reply_to=to)


# five clients: (num-examples, eval-accuracy, eval-loss, personal-accuracy, personal-loss); the
# fifth is a Flower quickstart's evaluate (eval_acc, eval_loss, no personalised scores)
CLIENTS = {1: (10, 0.5, 1.0, 0.6, 0.5), 2: (30, 0.9, 0.2, 1.0, 0.1), 3: (20, 0.7, 0.6, 0.8, 0.3),
           4: (20, 0.6, 0.8, 0.7, 0.4)}
FLOWER_CLIENT = (20, 0.8, 0.4)


def _replies(sent: dict[int, Message]) -> list[Message]:
    out = [_scores(sent[node], **{wire.NUM_EXAMPLES: n, wire.EVAL_ACCURACY: acc, wire.EVAL_LOSS: loss,
                                  wire.PERSONAL_ACCURACY: pa, wire.PERSONAL_LOSS: pl,
                                  wire.PARTITION_ID: node - 1})
           for node, (n, acc, loss, pa, pl) in CLIENTS.items()]
    n, acc, loss = FLOWER_CLIENT
    return [*out, _scores(sent[5], **{"num-examples": n, "eval_acc": acc, "eval_loss": loss})]


def test_the_aggregate_is_the_trimmed_weighted_mean_and_the_worst_decile_by_hand() -> None:
    """Global model, all five (weights 10:30:20:20:20), one cut at each end (h = 1 by default):
    accuracy [0.5, 0.9] cut, 0.6, 0.7, 0.8 kept at 20 each: 0.7; loss [0.2, 1.0] cut: 0.6;
    worst decile of the kept [0.6, 0.7, 0.8]: position 0.1·2 = 0.2, 0.6 + 0.2·0.1 = 0.62.
    Personalised, the four that report it: accuracy [0.6, 1.0] cut, 0.7 and 0.8 at 20 each: 0.75;
    loss [0.1, 0.5] cut: 0.35; decile of [0.7, 0.8]: 0.7 + 0.1·0.1 = 0.71."""
    strategy = _strategy()
    sent = _evaluate(strategy)
    assert sorted(sent) == [1, 2, 3, 4, 5]
    record = strategy.aggregate_evaluate(1, reversed(_replies(sent)))  # arrival order does not matter
    report = strategy.eval_report
    expected = {"fed-eval-accuracy": 0.7, "fed-eval-loss": 0.6, "fed-eval-accuracy-p10": 0.62,
                "fed-eval-personal-accuracy": 0.75, "fed-eval-personal-loss": 0.35,
                "fed-eval-personal-accuracy-p10": 0.71}
    assert report.metrics == pytest.approx(expected, abs=1e-12)
    assert dict(record) == pytest.approx(expected, abs=1e-12)  # what Flower's start() logs
    assert not report.rejected and sorted(report.clients) == ["0", "1", "2", "3", "node-5"]
    assert report.clients["2"][wire.PERSONAL_ACCURACY] == 0.8 and report.clients["2"]["node-id"] == 3
    assert report.clients["node-5"] == {wire.NUM_EXAMPLES: 20, wire.EVAL_ACCURACY: 0.8, wire.EVAL_LOSS: 0.4,
                                        "node-id": 5}
    row = report.row(seconds=0.5)
    assert row["fed-eval-replies"] == 5 and row["fed-eval-sampled"] == 5 and "fed-eval-rejected" not in row
    assert row["fed-eval-trimmed-per-end"] == 1 and row["fed-eval-weights-capped"] == 0
    model_bytes = sum(len(a.data) for r in _evaluate(_strategy())[1].content.array_records.values()
                      for a in r.values())
    assert model_bytes > 0 and row["fed-eval-bytes-down"] == 5 * model_bytes  # five copies sent


def test_a_claim_far_above_the_median_is_capped_as_a_training_weight_is() -> None:
    """max-weight-ratio=2: weights 10, 10, 10, 1000, 10 -> median 10, cap 20; 0.0 and 1.0 cut:
    (0.2·10 + 0.4·10 + 0.6·20)/40 = 0.45 (uncapped: 0.59)."""
    strategy = _strategy(max_weight_ratio=2.0)
    sent = _evaluate(strategy)
    strategy.aggregate_evaluate(1, [_scores(sent[n], **{wire.NUM_EXAMPLES: e, wire.EVAL_ACCURACY: a})
                                    for n, e, a in ((1, 10, 0.0), (2, 10, 0.2), (3, 10, 0.4),
                                                    (4, 1000, 0.6), (5, 10, 1.0))])
    assert strategy.eval_report.metrics["fed-eval-accuracy"] == pytest.approx(0.45)
    assert strategy.eval_report.row(0.0)["fed-eval-weights-capped"] == 1


def test_worst_decile_is_numpys_default_percentile() -> None:
    rng = np.random.default_rng(0)
    for n in (1, 2, 3, 7, 10, 11, 100):
        values = rng.random(n).tolist()
        assert worst_decile(values) == pytest.approx(float(np.percentile(values, 10)), abs=1e-12)


@pytest.mark.parametrize("bad,why", [
    (lambda to: Message(Error(code=0, reason="Traceback ...\nValueError: no data"), reply_to=to),
     "the client failed: ValueError: no data"),
    (lambda to: _scores(to, **{wire.NUM_EXAMPLES: 10, wire.EVAL_ACCURACY: 1.5}), "eval-accuracy=1.5"),
    (lambda to: _scores(to, **{wire.NUM_EXAMPLES: 10, wire.EVAL_LOSS: float("nan")}), "eval-loss=nan"),
    (lambda to: _scores(to, **{wire.EVAL_ACCURACY: 0.5}), "num-examples=None"),
    (lambda to: _scores(to, **{wire.NUM_EXAMPLES: 0, wire.EVAL_ACCURACY: 0.5}), "num-examples=0"),
    (lambda to: _scores(to, **{wire.NUM_EXAMPLES: 10, "f1": 0.5}), "none of the scores"),
    (lambda to: Message(RecordDict(), reply_to=to), "no 'metrics' record"),
])
def test_a_bad_reply_is_dropped_with_its_reason(bad, why: str) -> None:
    strategy = _strategy()
    sent = _evaluate(strategy, InProcessGrid(2, {}))
    good = _scores(sent[1], **{wire.NUM_EXAMPLES: 10, wire.EVAL_ACCURACY: 0.25})
    strategy.aggregate_evaluate(1, [good, bad(sent[2])])
    report = strategy.eval_report
    assert list(report.rejected) == ["2"] and why in report.rejected["2"], report.rejected
    assert report.metrics == {"fed-eval-accuracy": 0.25, "fed-eval-accuracy-p10": 0.25}


def test_a_reply_from_no_evaluate_message_or_a_second_reply_is_not_trusted() -> None:
    strategy = _strategy()
    sent = _evaluate(strategy, InProcessGrid(2, {}))
    trained = _configure(strategy, 1, InProcessGrid(2, {}))  # a TRAIN instruction's id
    replies = [_scores(sent[1], **{wire.NUM_EXAMPLES: 10, wire.EVAL_ACCURACY: 0.5}),
               _scores(sent[1], **{wire.NUM_EXAMPLES: 10, wire.EVAL_ACCURACY: 0.9}),
               _scores(trained[2], **{wire.NUM_EXAMPLES: 10, wire.EVAL_ACCURACY: 0.9})]
    assert strategy.aggregate_evaluate(1, replies) is None  # nothing counted
    # the in-process grid sets no message ids: a reply is matched by its sender, then its type
    assert strategy.eval_report.rejected == {"1": "more than one evaluate reply from one node",
                                             "2": "message type 'train', expected 'evaluate'"}


def test_a_forged_reply_is_dropped_alone_and_a_stray_one_names_no_node() -> None:
    """With message ids (as a SuperLink sets them): node 3 answers node 2's evaluate message in
    its own name; node 2's own reply still counts. A reply to no message of ours is 'unknown'."""
    strategy = _strategy()
    sent = _evaluate(strategy, InProcessGrid(3, {}))
    for node, msg in sent.items():
        msg.metadata.__dict__["_message_id"] = f"evaluate-{node}"
    forged = _scores(sent[2], **{wire.NUM_EXAMPLES: 10, wire.EVAL_ACCURACY: 1.0})
    forged.metadata.__dict__["_src_node_id"] = 3
    stray = _scores(sent[1], **{wire.NUM_EXAMPLES: 10, wire.EVAL_ACCURACY: 1.0})
    stray.metadata.__dict__["_reply_to_message_id"] = "train-1"
    honest = [_scores(sent[n], **{wire.NUM_EXAMPLES: 10, wire.EVAL_ACCURACY: 0.1 * n}) for n in (1, 2, 3)]
    strategy.aggregate_evaluate(1, [forged, stray, *honest])
    assert strategy.eval_report.rejected == {
        "3->2": "reply to node 2's evaluate message sent by node 3",
        "unknown": "a reply to no evaluate message of this round"}
    assert strategy.eval_report.metrics["fed-eval-accuracy"] == pytest.approx(0.2)


def test_nothing_is_sent_by_default_and_the_messages_are_the_rounds_model() -> None:
    off = _strategy(fraction_evaluate=0.0)
    assert _evaluate(off) == {} and off.aggregate_evaluate(1, []) is None
    on = _strategy(fraction_evaluate=1.0, evaluate_local_steps=3)
    message = _evaluate(on)[1]
    assert message.metadata.message_type == MessageType.EVALUATE
    sent = message.content.array_records[wire.ARRAYS].to_torch_state_dict()
    assert {k: v.tolist() for k, v in sent.items()} == {k: v.tolist() for k, v in MODEL.items()}
    assert message.content.config_records[wire.RECIPE][EVALUATE_STEPS] == 3


def test_the_sample_is_of_seed_and_round_and_leaves_the_training_sample_alone() -> None:
    grid = InProcessGrid(10, {})
    on, off = _strategy(fraction_evaluate=0.5, fraction_train=0.3), _strategy(fraction_train=0.3,
                                                                              fraction_evaluate=0.0)
    for server_round in (1, 2, 3):
        trained = [sorted(_configure(s, server_round, grid)) for s in (on, off)]
        assert trained[0] == trained[1]  # evaluation draws nothing from the training sample's RNG
        evaluated = on.configure_evaluate(server_round, ArrayRecord(on.state.model), ConfigRecord(), grid)
        nodes = sorted(m.metadata.dst_node_id for m in evaluated)
        assert nodes == evaluation_sample(on.cfg.federation.seed, server_round, list(range(1, 11)), 0.5)
        assert len(nodes) == 5
    ten = list(range(1, 11))
    assert evaluation_sample(42, 1, ten, 0.5) != evaluation_sample(42, 2, ten, 0.5)
    assert evaluation_sample(42, 1, [1, 2, 3], 0.01) != []  # at least one node


def test_fraction_evaluate_is_checked_in_one_line() -> None:
    for value, said in ((1.5, "invalid fraction-evaluate=1.5: must be <= 1.0"),
                        (-0.1, "invalid fraction-evaluate=-0.1: must be >= 0.0")):
        with pytest.raises(ValueError, match=said):
            FedACT(fraction_evaluate=value)
    with pytest.raises(ValueError, match="evaluate-local-steps=5 is read only by federated evaluation"):
        FedACT(evaluate_local_steps=5)


def test_flowers_start_sends_evaluate_messages_and_the_evaluate_config() -> None:
    """Under `Strategy.start` a stock Flower evaluate handler (eval_acc, eval_loss) on each node;
    train replies leave the model as it was (Δ = 0). Node n scores n/10 on 10·n rows:
    weighted (1·10 + 2·20)/30 ... = (0.1·10 + 0.2·20)/30 = 1/6."""
    seen: list[dict] = []

    def node(msg: Message, context) -> Message:  # noqa: ANN001
        n = context.node_id
        if msg.metadata.message_type == MessageType.EVALUATE:
            seen.append(dict(msg.content.config_records[wire.CONFIG]))
            return _scores(msg, **{"num-examples": 10 * n, "eval_acc": n / 10, "eval_loss": 1.0})
        delta = {k: torch.zeros_like(v) for k, v in MODEL.items()}
        return Message(RecordDict({wire.DELTA: ArrayRecord(delta), wire.METRICS: MetricRecord(
            {wire.NUM_EXAMPLES: 5, wire.TRAIN_LOSS: 1.0})}), reply_to=msg)

    strategy = FedAvg(fraction_evaluate=1.0, local_steps=1)
    result = strategy.start(grid=InProcessGrid(2, {}, handler=node), initial_arrays=ArrayRecord(MODEL),
                            num_rounds=2, evaluate_config=ConfigRecord({"batch": 8}))
    assert sorted(result.evaluate_metrics_clientapp) == [1, 2]
    assert result.evaluate_metrics_clientapp[2]["fed-eval-accuracy"] == pytest.approx(1 / 6)
    assert result.evaluate_metrics_clientapp[2]["fed-eval-accuracy-p10"] == pytest.approx(0.11)
    assert seen[0] == {"batch": 8, "server-round": 1} and len(seen) == 4
