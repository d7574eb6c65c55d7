"""`python benchmarks/contribution_bound.py`: the tables of docs/robustness.md "Contribution bound"
(issue 32 §1). tests/e2e/test_hostile_e2e.py's setup (MLP, the first 600/200 Fashion-MNIST
images, 5 nodes, 8 rounds of 10 local steps, seed 1), the other defaults as they are
(screen-ratio 10, max-weight-ratio 10), `max-contribution-ratio` in {0, 2, 3} (2: the default):

- attacked: final test accuracy, iid, one client of five rewriting its reply inside the per-part
  screens (tests/e2e/test_contribution_bound.py ATTACKS): "9×/−9×" (num-examples × 9 of the
  median claim, Δ × −9: 81× a median client), "capped flip" (num-examples 2**62, Δ × −0.9) and
  "bound-riding flip" (its own claim, Δ × −9: clipped to exactly the bound, flipped);
- honest cost: clean runs under 'dirichlet' (α 0.3) and 'pathological' partitioning, final
  accuracy and the replies clipped / weights capped per round (mean over the rounds).

About 6 min on 2 cores (one torch thread). `--algorithms`, `--ratios`, `--tables` to run a part,
`--seed` another seed."""

from __future__ import annotations

import argparse
import logging
import pathlib
import statistics
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from adaptfl.client_app.app import train_or_refuse  # noqa: E402
from adaptfl.engine.inprocess import InProcessGrid  # noqa: E402
from adaptfl.server_app.abort import RunAborted  # noqa: E402
from adaptfl.server_app.loop import run_federated  # noqa: E402
from benchmarks.hostile_table import tiny_fashion_mnist  # noqa: E402
from benchmarks.machine import describe  # noqa: E402
from tests.e2e.test_contribution_bound import ATTACKS  # noqa: E402
from tests.e2e.test_hostile_e2e import _config as _hostile_config  # noqa: E402
from tests.e2e.test_hostile_e2e import hostile  # noqa: E402
from tests.support.run_outputs import metric_rows  # noqa: E402

ALGORITHMS = ["fedavg", "fedact", "scaffold", "fedpac-sophia", "hafedho"]
RATIOS = [0.0, 2.0, 3.0]
NODES = 5


def _config(data: dict, out: pathlib.Path, algorithm: str, **kw):  # noqa: ANN202
    """The hostile tests' run, one torch thread (the numbers do not depend on it)."""
    return _hostile_config(data, out, algorithm, num_threads=1, **kw)


def run(cfg, handler) -> tuple[float, float, float]:  # noqa: ANN001
    """(final test accuracy, replies clipped per round, weights capped per round); an aborted
    run: accuracy 0."""
    try:
        rows = metric_rows(run_federated(InProcessGrid(NODES, cfg.to_flower(), handler=handler), cfg))
    except RunAborted:
        return 0.0, float("nan"), float("nan")
    rows = [r for r in rows if not r.get("skipped")]
    clipped = statistics.mean(float(r.get("replies-clipped") or 0.0) for r in rows)
    capped = statistics.mean(float(r.get("weights-capped") or 0.0) for r in rows)
    return rows[-1]["test-accuracy"], clipped, capped


def attacked(data: dict, work: pathlib.Path, algorithms: list[str], ratios: list[float],
             seed: int = 1) -> None:
    heads = [f"{name}, ratio {r:g}" for name in ATTACKS for r in ratios]
    print("| algorithm | " + " | ".join(f"clean, ratio {r:g}" for r in ratios) + " | "
          + " | ".join(heads) + " | worst attacked − clean (ratio " + ", ".join(f"{r:g}" for r in ratios)
          + ") |")
    print("|---|" + "---|" * (len(ratios) + len(heads) + 1))
    for algorithm in algorithms:
        out = work / "iid" / algorithm
        clean = [run(_config(data, out, algorithm, rounds=8, seed=seed, max_contribution_ratio=r),
                     train_or_refuse)[0] for r in ratios]
        hit = {(name, r): run(_config(data, out, algorithm, rounds=8, seed=seed, max_contribution_ratio=r),
                              hostile(attack))[0]
               for name, attack in ATTACKS.items() for r in ratios}
        worst = [min(hit[name, r] for name in ATTACKS) - clean[0] for r in ratios]
        cells = [*clean, *(hit[name, r] for name in ATTACKS for r in ratios)]
        print(f"| {algorithm} | " + " | ".join(f"{a:.3f}" for a in cells) + " | "
              + ", ".join(f"{w:+.3f}" for w in worst) + " |", flush=True)


def honest(data: dict, work: pathlib.Path, algorithms: list[str], ratios: list[float],
           seed: int = 1) -> None:
    print("| algorithm | partitioning | " + " | ".join(f"ratio {r:g}" for r in ratios)
          + " | Δ accuracy vs ratio 0 | clipped / round | weights capped / round |")
    print("|---|---|" + "---|" * (len(ratios) + 3))
    for algorithm in algorithms:
        for partitioning in ("dirichlet", "pathological"):
            out = work / partitioning / algorithm
            cells = [run(_config(data, out, algorithm, rounds=8, seed=seed, partitioning=partitioning,
                                 max_contribution_ratio=r), train_or_refuse) for r in ratios]
            base = cells[0][0]
            diff = ", ".join(f"{c[0] - base:+.3f}" for c in cells[1:])
            clipped = ", ".join(f"{c[1]:.2f}" for c in cells[1:])
            capped = ", ".join(f"{c[2]:.2f}" for c in cells)
            print(f"| {algorithm} | {partitioning} | " + " | ".join(f"{c[0]:.3f}" for c in cells)
                  + f" | {diff} | {clipped} | {capped} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--algorithms", nargs="+", default=ALGORITHMS)
    parser.add_argument("--ratios", nargs="+", type=float, default=RATIOS,
                        help="max-contribution-ratio values; the first is the baseline")
    parser.add_argument("--seed", type=int, default=1,
                        help="the runs' seed (partition, model, batches); robustness.md: 1, 2, 3")
    parser.add_argument("--tables", nargs="+", default=["attacked", "honest"],
                        choices=["attacked", "honest"])
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    print(f"machine: {describe('cpu')}\n")  # accuracies, not timings: the machine for the record
    work = pathlib.Path(tempfile.mkdtemp(prefix="contribution-bound-"))
    data = {"fashion-mnist": tiny_fashion_mnist(work / "fashion-mnist")}
    if "attacked" in args.tables:
        attacked(data, work, args.algorithms, args.ratios, args.seed)
    if "honest" in args.tables:
        print()
        honest(data, work, args.algorithms, args.ratios, args.seed)


if __name__ == "__main__":
    main()
