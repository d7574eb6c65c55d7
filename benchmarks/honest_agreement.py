"""`python benchmarks/honest_agreement.py`: why no direction screen is a default
(docs/robustness.md "Contribution bound"). Per round, each reply's Δ against the weighted mean of
the round's other replies (cosine, leave-one-out), in honest runs and under the capped flip, in
tests/e2e/test_hostile_e2e.py's setup (MLP, the first 600/200 Fashion-MNIST images, 5 nodes,
8 rounds of 10 local steps, seed 1, the defaults). A screen that drops a reply pointing against
the others would have to sit below every honest cosine; the table says where honest ones go.
About 3 min on 2 idle cores (one torch thread). `--algorithms`, `--partitionings` to run a part."""

from __future__ import annotations

import argparse
import logging
import pathlib
import statistics
import sys
import tempfile

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from adaptfl.client_app.app import train_or_refuse  # noqa: E402
from adaptfl.core import wire  # noqa: E402
from adaptfl.engine.inprocess import InProcessGrid  # noqa: E402
from adaptfl.server_app.loop import run_federated  # noqa: E402
from adaptfl.server_rules.aggregators import flat  # noqa: E402
from adaptfl.strategies import intake  # noqa: E402
from adaptfl.strategies.validation import DecodedReply  # noqa: E402
from benchmarks.hostile_table import tiny_fashion_mnist  # noqa: E402
from benchmarks.machine import describe  # noqa: E402
from tests.e2e.test_contribution_bound import CAPPED_FLIP  # noqa: E402
from tests.e2e.test_hostile_e2e import _config, hostile  # noqa: E402

ALGORITHMS = ["fedavg", "fedact", "scaffold", "fedpac-sophia", "hafedho"]
PARTITIONINGS = ["iid", "dirichlet", "pathological"]


def leave_one_out(replies: list[DecodedReply], weights: list[float]) -> list[float]:
    """cos(Δ_i, Σ_{j≠i} w_j Δ_j) per reply."""
    deltas = [flat(r.arrays[wire.DELTA]).double() for r in replies]
    total = sum(w * d for w, d in zip(weights, deltas, strict=True))
    return [float(torch.nn.functional.cosine_similarity(d, total - w * d, dim=0))
            for w, d in zip(weights, deltas, strict=True)]


def run(cfg, handler) -> list[list[tuple[int, float]]]:  # noqa: ANN001
    """Per round, (partition id, cosine) of every reply that reached the screen."""
    rounds: list[list[tuple[int, float]]] = []
    screen = intake.ReplyIntake._screen

    def probe(self, pairs):  # noqa: ANN001, ANN202
        replies = [r for _, r in pairs]
        cosines = leave_one_out(replies, self._claims(replies))
        rounds.append([(int(r.metrics.get(wire.PARTITION_ID, -1)), c)
                       for r, c in zip(replies, cosines, strict=True)])
        return screen(self, pairs)

    intake.ReplyIntake._screen = probe
    try:
        run_federated(InProcessGrid(5, cfg.to_flower(), handler=handler), cfg)
    finally:
        intake.ReplyIntake._screen = screen
    return rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--algorithms", nargs="+", default=ALGORITHMS)
    parser.add_argument("--partitionings", nargs="+", default=PARTITIONINGS)
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    print(f"machine: {describe('cpu')}\n")
    work = pathlib.Path(tempfile.mkdtemp(prefix="honest-agreement-"))
    data = {"fashion-mnist": tiny_fashion_mnist(work / "fashion-mnist")}
    print("| algorithm | partitioning | honest min | honest median | lowest honest cosine per round "
          "| the capped flip's cosine (iid), per round |")
    print("|---|---|---|---|---|---|")
    for algorithm in args.algorithms:
        for partitioning in args.partitionings:
            cfg = _config(data, work / algorithm / partitioning, algorithm, rounds=8,
                          partitioning=partitioning, num_threads=1)
            rounds = run(cfg, train_or_refuse)
            every = [c for r in rounds for _, c in r]
            flip = ""
            if partitioning == "iid":
                hit = run(cfg, hostile(CAPPED_FLIP))
                flip = " ".join(f"{c:+.2f}" for r in hit for p, c in r if p == 0)
            print(f"| {algorithm} | {partitioning} | {min(every):+.2f} | {statistics.median(every):+.2f} | "
                  + " ".join(f"{min(c for _, c in r):+.2f}" for r in rounds) + f" | {flip} |", flush=True)


if __name__ == "__main__":
    main()
