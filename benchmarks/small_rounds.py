"""`python benchmarks/small_rounds.py`: the table of docs/robustness.md "Rounds of one and two
replies". tests/e2e/test_hostile_e2e.py's setup (MLP, the first 600/200 Fashion-MNIST images, 5
nodes, 8 rounds of 10 local steps), the defaults, `fraction-train` 0.4 (two replies a round) and
0.2 (one), node 1 hostile whenever it is sampled:

- "9×/−9×" (num-examples × 9, Δ and Δc × −9) and "flip × 9" (its own claim, Δ and Δc × −9),
  tests/e2e/test_contribution_bound.py's NINE_BY_MINUS_NINE and BOUND_RIDING;
- "lone in round 1": flip × 9 from round 1's one reply only (the screen history's first sample);
- final test accuracy of the clean and the attacked run, and with the bound off
  (`max-contribution-ratio=0`), per seed.

`--honest`: the honest cost instead, clean runs on Dirichlet α = 0.3 splits, bound on and off.
About 1 min per algorithm and seed on 2 cores (one torch thread)."""

from __future__ import annotations

import argparse
import logging
import pathlib
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from adaptfl.client_app.app import train_or_refuse  # noqa: E402
from adaptfl.strategies import contribution  # noqa: E402
from benchmarks import hostile_table  # noqa: E402
from benchmarks.contribution_bound import run  # noqa: E402
from benchmarks.hostile_table import tiny_fashion_mnist  # noqa: E402
from benchmarks.machine import describe  # noqa: E402
from tests.e2e.test_contribution_bound import BOUND_RIDING, NINE_BY_MINUS_NINE  # noqa: E402
from tests.e2e.test_hostile_e2e import _config as _hostile_config  # noqa: E402
from tests.e2e.test_hostile_e2e import hostile  # noqa: E402

ALGORITHMS = ["fedavg", "fedact", "scaffold"]
# (fraction-train, attack, hostile: partition 0 whenever sampled, or whoever is in round 1)
CASES = {"2 a round, 9×/−9×": (0.4, NINE_BY_MINUS_NINE, {}),
         "2 a round, flip × 9": (0.4, BOUND_RIDING, {}),
         "1 a round, flip × 9": (0.2, BOUND_RIDING, {}),
         "1 a round, lone in round 1": (0.2, BOUND_RIDING, {"partition": None, "rounds": {1}})}


def _config(data: dict, out: pathlib.Path, algorithm: str, seed: int, fraction: float, **kw):  # noqa: ANN202
    return _hostile_config(data, out, algorithm, rounds=8, num_threads=1, seed=seed,
                           fraction_train=fraction, accept_small_rounds=True, **kw)


def attacked(data: dict, work: pathlib.Path, algorithms: list[str], seeds: list[int],
             ratio: float = 2.0) -> None:
    print("| algorithm | seed | case | clean | attacked | attacked, bound off | attacked − clean |")
    print("|---|---|---|---|---|---|---|")
    for algorithm in algorithms:
        for seed in seeds:
            clean = {f: run(_config(data, work / algorithm, algorithm, seed, f), train_or_refuse)[0]
                     for f in (0.4, 0.2)}
            for name, (fraction, attack, who) in CASES.items():
                handler = hostile(attack, **who)
                on = run(_config(data, work / algorithm, algorithm, seed, fraction,
                                 max_contribution_ratio=ratio), handler)[0]
                off = run(_config(data, work / algorithm, algorithm, seed, fraction,
                                  max_contribution_ratio=0.0), handler)[0]
                print(f"| {algorithm} | {seed} | {name} | {clean[fraction]:.3f} | {on:.3f} | {off:.3f} "
                      f"| {on - clean[fraction]:+.3f} |", flush=True)


def honest(data: dict, work: pathlib.Path, algorithms: list[str], seeds: list[int],
           ratio: float = 2.0) -> None:
    print("| algorithm | fraction-train | seed | bound off | default | default − off | clipped / round |")
    print("|---|---|---|---|---|---|---|")
    for algorithm in algorithms:
        for fraction in (0.4, 0.2):
            for seed in seeds:
                cells = [run(_config(data, work / algorithm, algorithm, seed, fraction,
                                     partitioning="dirichlet", max_contribution_ratio=r),
                             train_or_refuse) for r in (0.0, ratio)]
                print(f"| {algorithm} | {fraction:g} | {seed} | {cells[0][0]:.3f} | {cells[1][0]:.3f} "
                      f"| {cells[1][0] - cells[0][0]:+.3f} | {cells[1][1]:.2f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--algorithms", nargs="+", default=ALGORITHMS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--honest", action="store_true", help="the honest cost on Dirichlet α 0.3")
    parser.add_argument("--images", nargs=2, type=int, metavar=("TRAIN", "TEST"),
                        help="the first TRAIN/TEST Fashion-MNIST images (default: the tests' 600/200)")
    parser.add_argument("--cases", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--ratio", type=float, default=2.0, help="max-contribution-ratio (2: the default)")
    parser.add_argument("--small-round-ratio", type=float, default=contribution.SMALL_ROUND_RATIO,
                        help="measure another value of contribution.SMALL_ROUND_RATIO")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    contribution.SMALL_ROUND_RATIO = args.small_round_ratio
    if args.images:
        hostile_table.TINY_FASHION_MNIST = tuple(args.images)
    for name in set(CASES) - set(args.cases):
        del CASES[name]
    print(f"machine: {describe('cpu')}; SMALL_ROUND_RATIO {contribution.SMALL_ROUND_RATIO:g}\n")
    work = pathlib.Path(tempfile.mkdtemp(prefix="small-rounds-"))
    data = {"fashion-mnist": tiny_fashion_mnist(work / "fashion-mnist")}
    (honest if args.honest else attacked)(data, work, args.algorithms, args.seeds, args.ratio)


if __name__ == "__main__":
    main()
