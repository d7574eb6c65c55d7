"""`python benchmarks/eval_liars.py`: the federated-evaluation rows of docs/robustness.md
("Evaluation replies that lie"). tests/e2e/test_hostile_e2e.py's setup (MLP, the first 600/200
Fashion-MNIST images iid, 4 rounds of 10 local steps, seed 1), fedavg, `fraction-evaluate=1`;
the liars rewrite their evaluate replies every round (their training stays honest):

- "accuracy 0 / 1": eval-accuracy and personal-accuracy 0.0 (1.0), num-examples × 10;
- "loss 1e308": eval-loss 1e308 (finite: passes the intake), num-examples × 10.

Per attack, round 4's `fed-eval-accuracy`, its worst decile and `fed-eval-loss` as written, and
beside them the plain weighted mean and decile of the same replies (the rule before the robust
estimate, recomputed from `fed-eval-clients` with the weights capped at 10× the median)."""

from __future__ import annotations

import argparse
import logging
import pathlib
import statistics
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from flwr.app import Message, MessageType, MetricRecord  # noqa: E402

from adaptfl.algorithms.config import RunConfig  # noqa: E402
from adaptfl.client_app.app import answer  # noqa: E402
from adaptfl.core import wire  # noqa: E402
from adaptfl.engine.inprocess import InProcessGrid  # noqa: E402
from adaptfl.server_app.loop import run_federated  # noqa: E402
from adaptfl.strategies.robust_scores import worst_decile  # noqa: E402
from benchmarks.hostile_table import tiny_fashion_mnist  # noqa: E402
from benchmarks.machine import describe  # noqa: E402
from tests.support.run_outputs import metric_rows  # noqa: E402

ATTACKS = {"clean": {}, "accuracy 0": {wire.EVAL_ACCURACY: 0.0, wire.PERSONAL_ACCURACY: 0.0},
           "accuracy 1": {wire.EVAL_ACCURACY: 1.0, wire.PERSONAL_ACCURACY: 1.0},
           "loss 1e308": {wire.EVAL_LOSS: 1e308}}


def handler(lie: dict, liars: set[int]):  # noqa: ANN201 - a ClientApp handler
    def handle(msg: Message, context) -> Message:  # noqa: ANN001
        reply = answer(msg, context)
        if msg.metadata.message_type == MessageType.EVALUATE and context.node_id in liars \
                and lie and not reply.has_error():
            metrics = dict(reply.content.metric_records[wire.METRICS])
            metrics.update({**lie, wire.NUM_EXAMPLES: 10 * int(metrics[wire.NUM_EXAMPLES])})
            reply.content[wire.METRICS] = MetricRecord(metrics)
        return reply
    return handle


def plain(clients: dict, key: str) -> tuple[float, float]:
    """The weighted mean (weights capped at 10× the median) and the decile of every reply."""
    claims = [c["num-examples"] for c in clients.values()]
    cap = 10 * statistics.median(claims)
    pairs = [(c[key], min(n, cap)) for c, n in zip(clients.values(), claims, strict=True)]
    mean = sum(v * w for v, w in pairs) / sum(w for _, w in pairs)  # as it was: 1e308 · w overflows
    return mean, worst_decile([v for v, _ in pairs])


def run(name: str, nodes: int, liars: set[int], data: str, out: pathlib.Path, **extra) -> dict:  # noqa: ANN003
    cfg = RunConfig.of(algorithm="fedavg", model="mlp", num_server_rounds=4, local_steps=10, batch_size=16,
                       data_dir=data, partitioning="iid", seed=1, results_dir=str(out), run_name="r",
                       fraction_evaluate=1.0, num_threads=1, overwrite=True, **extra)
    rows = metric_rows(run_federated(InProcessGrid(nodes, cfg.to_flower(), handler=handler(ATTACKS[name],
                                                                                              liars)), cfg))
    last = rows[-1]
    mean, decile = plain(last["fed-eval-clients"], wire.EVAL_ACCURACY)
    loss, _ = plain(last["fed-eval-clients"], wire.EVAL_LOSS)
    return {"accuracy": last["fed-eval-accuracy"], "p10": last["fed-eval-accuracy-p10"],
            "loss": last["fed-eval-loss"], "cut": last["fed-eval-trimmed-per-end"],
            "plain": (mean, decile, loss), "test": last["test-accuracy"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    torch.set_num_threads(1)
    print(describe("cpu"))
    cases = [(f"{name}, 1 of 5", name, 5, {5}, {}) for name in ATTACKS] + \
        [(f"{name}, 2 of 7 (trimmed-mean hostile-fraction=0.3 min-replies=3)", name, 7, {6, 7},
          {"aggregator": "trimmed-mean", "hostile_fraction": 0.3, "min_replies": 3})
         for name in ("clean", "accuracy 0")]
    print("| evaluate replies | fed-eval-accuracy (p10) | loss | cut per end | "
          "before: weighted mean (p10), loss |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        data = tiny_fashion_mnist(pathlib.Path(tmp) / "data")
        for label, name, nodes, liars, extra in cases:
            r = run(name, nodes, liars, data, pathlib.Path(tmp) / "runs", **extra)
            mean, decile, loss = r["plain"]
            print(f"| {label} | {r['accuracy']:.3f} ({r['p10']:.3f}) | {r['loss']:.3g} | {r['cut']} | "
                  f"{mean:.3f} ({decile:.3f}), {loss:.3g} |", flush=True)


if __name__ == "__main__":
    main()
