"""`python benchmarks/honest_screen.py [--seeds 0] [--rounds N]`: how close honest runs come to
the default screens (docs/robustness.md, issue 21 §2). Runs every cell of the results page's
grids (harness/grids/*.toml; one seed by default) with the screens at their defaults, and prints
per grid the largest `screen-ratio-max` of any round (a reply's weight × record norm over the
median of the others'; the screen drops above `screen-ratio`), the replies screened and weights capped
(both must be 0: then the run is bit-identical to one without the screens), and the largest
partition size over the median partition size of the grid's partitioning (what
`max-weight-ratio` compares a claim with). Slow: the grids' full settings, one process."""

from __future__ import annotations

import argparse
import csv
import logging
import pathlib
import sys
import tempfile

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from adaptfl.algorithms.config import RunConfig  # noqa: E402
from adaptfl.engine.inprocess import run_inprocess  # noqa: E402
from adaptfl.harness.grid import load_grid  # noqa: E402
from adaptfl.workloads import load_task  # noqa: E402
from adaptfl.workloads.partitioning import partition_indices  # noqa: E402


def size_ratio(cfg: RunConfig, num_nodes: int) -> float:
    """Largest partition over the median partition of this cell's split."""
    task = load_task(cfg.data.task, cfg.data.data_dir)
    labels = np.asarray(task.train.labels)
    sizes = [len(partition_indices(labels, num_nodes, p, cfg.data.partitioning,
                                   cfg.data.dirichlet_alpha, cfg.federation.seed))
             for p in range(num_nodes)]
    return max(sizes) / float(np.median(sizes))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--rounds", type=int, default=0, help="0: the grid's own")
    parser.add_argument("--grids", nargs="+", default=[  # the quickest first
        str(ROOT / "adaptfl" / "harness" / "grids" / f"{name}.toml")
        for name in ("hafedho", "fedadamom", "fedpac", "fedmixp", "fedact")])
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    work = pathlib.Path(tempfile.mkdtemp(prefix="honest-screen-"))
    print("| grid | runs | largest screen-ratio-max | replies screened | weights capped | "
          "largest partition / median |")
    print("|---|---|---|---|---|---|")
    for path in args.grids:
        grid = load_grid(path)
        worst, screened, capped, sizes, runs = 0.0, 0, 0, 0.0, 0
        for cell in grid.cells():
            if cell.axes["seed"] not in args.seeds:
                continue
            config = {**cell.run_config, "results-dir": str(work), "run-name": cell.cell_id,
                      "num-threads": 1, "client-state-dir": str(work / cell.cell_id / "state")}
            if args.rounds:
                config["num-server-rounds"] = args.rounds
            cfg = RunConfig.from_flower(config, drop_unused=True)
            out = work / cell.cell_id  # a cell two grids share (fedavg) runs once
            if not (out / "model.pt").exists():
                out = run_inprocess(cfg, cell.num_nodes)
            with (out / "metrics.csv").open(newline="") as fh:
                rows = [r for r in csv.DictReader(fh) if int(r["round"]) >= 1]
            worst = max([worst, *(float(r["screen-ratio-max"]) for r in rows)])
            screened += sum(int(float(r["replies-screened"])) for r in rows)
            capped += sum(int(float(r.get("weights-capped") or 0)) for r in rows)
            sizes = max(sizes, size_ratio(cfg, cell.num_nodes))
            runs += 1
        print(f"| {grid.name} | {runs} | {worst:.2f} | {screened} | {capped} | {sizes:.2f} |",
              flush=True)


if __name__ == "__main__":
    main()
