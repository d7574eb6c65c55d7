"""Federated evaluation against lying clients (strategies/robust_scores.py): one liar of five,
whatever accuracy and num-examples it claims, or two of seven at hostile-fraction=0.3, cannot
move fed-eval-accuracy or its worst decile outside the honest clients' range; arrival order
changes nothing; a finite but huge loss does not become Infinity in the row."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from adaptfl.core import wire
from adaptfl.core.json_rows import NON_FINITE, json_line
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.strategies.robust_scores import cut_per_end
from tests.strategies.test_federated_evaluation import _evaluate, _scores, _strategy

HONEST = [0.62, 0.70, 0.74, 0.78, 0.81, 0.66, 0.72]  # accuracies, 100 examples each


def _row(strategy, sent, liars: dict[int, tuple[float, float]], honest: list[float]) -> dict:  # noqa: ANN001
    replies, values = [], iter(honest)
    for node in sorted(sent):
        acc, examples = liars[node] if node in liars else (next(values), 100)
        replies.append(_scores(sent[node], **{wire.NUM_EXAMPLES: examples, wire.EVAL_ACCURACY: acc,
                                              wire.PARTITION_ID: node - 1}))
    strategy.aggregate_evaluate(1, replies)
    return strategy.eval_report.row(0.0)


@pytest.mark.parametrize("node,accuracy,examples", itertools.product(
    (1, 3, 5), (0.0, 1.0, 0.71), (1, 10**9)))
def test_one_liar_of_five_stays_inside_the_honest_range(node: int, accuracy: float, examples: int) -> None:
    strategy = _strategy()
    row = _row(strategy, _evaluate(strategy), {node: (accuracy, examples)}, HONEST[:4])
    low, high = min(HONEST[:4]), max(HONEST[:4])
    assert low <= row["fed-eval-accuracy"] <= high
    assert low <= row["fed-eval-accuracy-p10"] <= high
    assert row["fed-eval-trimmed-per-end"] == 1


def test_two_colluders_of_seven_at_the_declared_fraction() -> None:
    strategy = _strategy(aggregator="trimmed-mean", hostile_fraction=0.3, min_replies=7)
    sent = _evaluate(strategy, InProcessGrid(7, {}))
    for lie in (0.0, 1.0):
        row = _row(strategy, sent, {2: (lie, 10**9), 6: (lie, 10**9)}, HONEST[:5])
        assert min(HONEST[:5]) <= row["fed-eval-accuracy-p10"] <= row["fed-eval-accuracy"] <= max(HONEST[:5])
        assert row["fed-eval-trimmed-per-end"] == 3  # ceil(0.3 · 7), at most (7 - 1) / 2


def test_arrival_order_changes_nothing() -> None:
    strategy = _strategy()
    sent = _evaluate(strategy)
    replies = [_scores(sent[n], **{wire.NUM_EXAMPLES: 10 * n, wire.EVAL_ACCURACY: a, wire.EVAL_LOSS: 1 - a,
                                   wire.PARTITION_ID: n - 1})
               for n, a in zip(sorted(sent), (0.7, 0.7, 0.2, 0.9, 0.7), strict=True)]
    rows = []
    for seed in range(6):
        random.Random(seed).shuffle(replies)
        strategy.aggregate_evaluate(1, list(replies))
        rows.append(dict(strategy.eval_report.metrics))
    assert all(r == rows[0] for r in rows)


@pytest.mark.parametrize("nodes", [2, 5])
def test_a_loss_of_1e308_stays_finite_and_the_row_is_json(nodes: int) -> None:
    """Two replies cut nothing: the weights are normalised before the product, so 1e308 · 0.5
    stays finite; five cut it."""
    strategy = _strategy()
    sent = _evaluate(strategy, InProcessGrid(nodes, {}))
    replies = [_scores(sent[n], **{wire.NUM_EXAMPLES: 20, wire.EVAL_LOSS: 1e308 if n == 1 else 0.5})
               for n in sorted(sent)]
    strategy.aggregate_evaluate(1, replies)
    loss = strategy.eval_report.metrics["fed-eval-loss"]
    assert loss == (pytest.approx(0.5e308) if nodes == 2 else 0.5)
    line = json_line(strategy.eval_report.row(0.0))
    assert json.loads(line, parse_constant=lambda c: pytest.fail(f"{c} in the row"))["fed-eval-loss"] == loss


def test_a_non_finite_value_is_written_null_and_named() -> None:
    line = json_line({"round": 1, "test-loss": float("inf"), "clients": {"3": {"train-loss": float("nan")}},
                      "test-accuracy": 0.5})
    row = json.loads(line, parse_constant=lambda c: pytest.fail(f"{c} in the row"))
    assert row == {"round": 1, "test-loss": None, "clients": {"3": {"train-loss": None}},
                   "test-accuracy": 0.5, NON_FINITE: ["test-loss", "clients/3/train-loss"]}
    assert NON_FINITE not in json.loads(json_line({"round": 2, "test-loss": 1e308}))


@pytest.mark.parametrize("fraction,replies,cut", [(0.0, 1, 0), (0.0, 2, 0), (0.0, 3, 1), (0.0, 10, 1),
                                                  (0.2, 5, 1), (0.2, 7, 2), (0.3, 7, 3), (0.3, 4, 1)])
def test_the_cut_per_end(fraction: float, replies: int, cut: int) -> None:
    assert cut_per_end(fraction, replies) == cut
