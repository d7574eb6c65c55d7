"""A strategy with Flower's advanced-pytorch habits: the lr halved from round 5 on (through the
train config, in `configure_train`), its own `start` loop that checkpoints the best global model
and writes every round's metrics to results.json."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from logging import INFO
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common import log
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result

from adaptfl.strategies import FedACT

HALVE_AT = 5  # the round from which the lr is halved


class CustomStrategy(FedACT):
    save_path = Path(".")
    best_accuracy = 0.0

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        if server_round == HALVE_AT:  # `start` passes the same record every round: it stays halved
            config["lr"] = config["lr"] * 0.5
            log(INFO, "lr halved to %g", config["lr"])
        return super().configure_train(server_round, arrays, config, grid)

    def keep_if_best(self, server_round: int, accuracy: float, arrays: ArrayRecord) -> None:
        if accuracy > self.best_accuracy:
            self.best_accuracy = accuracy
            torch.save(arrays.to_torch_state_dict(), self.save_path / f"best_model_round_{server_round}.pt")

    def save_results(self, result: Result, server_round: int) -> None:
        rows = [{"round": r, "train_metrics": dict(result.train_metrics_clientapp.get(r, {})),
                 "evaluate_metrics_clientapp": dict(result.evaluate_metrics_clientapp.get(r, {})),
                 "evaluate_metrics_serverapp": dict(result.evaluate_metrics_serverapp.get(r, {}))}
                for r in range(1, server_round + 1)]
        (self.save_path / "results.json").write_text(json.dumps(rows))

    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3, timeout: float = 3600,
              train_config: ConfigRecord | None = None, evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None) -> Result:
        train_config = train_config if train_config is not None else ConfigRecord()
        evaluate_config = evaluate_config if evaluate_config is not None else ConfigRecord()
        result, arrays = Result(), initial_arrays
        if evaluate_fn is not None and (scores := evaluate_fn(0, arrays)) is not None:
            result.evaluate_metrics_serverapp[0] = scores
        for server_round in range(1, num_rounds + 1):
            log(INFO, "[ROUND %s/%s]", server_round, num_rounds)
            replies = grid.send_and_receive(self.configure_train(server_round, arrays, train_config, grid),
                                            timeout=timeout)
            new_arrays, train_metrics = self.aggregate_train(server_round, replies)
            if new_arrays is not None:
                result.arrays = arrays = new_arrays
            if train_metrics is not None:
                result.train_metrics_clientapp[server_round] = train_metrics
            replies = grid.send_and_receive(
                self.configure_evaluate(server_round, arrays, evaluate_config, grid), timeout=timeout)
            evaluate_metrics = self.aggregate_evaluate(server_round, replies)
            if evaluate_metrics is not None:
                result.evaluate_metrics_clientapp[server_round] = evaluate_metrics
            if evaluate_fn is not None and (scores := evaluate_fn(server_round, arrays)) is not None:
                result.evaluate_metrics_serverapp[server_round] = scores
                self.keep_if_best(server_round, float(scores["accuracy"]), arrays)
            self.save_results(result, server_round)
        return result
