"""`python -m adaptfl.harness.sweep grid.toml [--jobs N]`: run a grid on the in-process engine.

Each cell is one federated run; its finished row is appended to `<results-dir>/<name>.csv`.
Rerunning skips the cells already in the table, so an interrupted sweep resumes where it
stopped (a cell cut off mid-run continues from its last checkpointed round). With `--jobs N`
cells run in N worker processes, each with one torch thread; only the parent writes the table.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tqdm import tqdm

from adaptfl import source as where
from adaptfl.algorithms.catalog import catalog
from adaptfl.algorithms.config import RunConfig
from adaptfl.harness.grid import Cell, Grid, load_grid
from adaptfl.harness.table import SERIES_PREFIX, append_row, finished_cells

# <checkout>/results/sweeps, or ~/.adaptfl/results/sweeps for an installed adaptfl
DEFAULT_RESULTS_DIR = (where.source_checkout() or Path.home() / ".adaptfl") / "results" / "sweeps"
CellRunner = Callable[[Cell, Path], dict[str, Any]]
# Table 11 of seed 000 (docs/llm-lora.md): held-out loss, perplexity, token accuracy, response NLL
SFT_METRICS = ("test-loss", "test-perplexity", "test-accuracy", "test-response-nll")


def run_cell(cell: Cell, results_dir: Path) -> dict[str, Any]:
    """Run one cell (continuing its checkpoint if an earlier attempt was cut off); its row."""
    import torch

    from adaptfl.engine.cohort import run_cohort
    from adaptfl.engine.inprocess import run_inprocess

    torch.set_num_threads(1)  # parallel jobs share the cores: one thread each
    run_dir = results_dir / "runs"
    # resume only a cell that an earlier attempt started: resume=true refuses an unknown name;
    # a cell draws no figures unless the grid asks (the sweep's table and report are its output)
    config = {"figures": False, **cell.run_config, "results-dir": str(run_dir), "run-name": cell.cell_id,
              "resume": (run_dir / cell.cell_id).is_dir(), "num-threads": 1,
              "client-state-dir": str(run_dir / cell.cell_id / "client-state")}
    started = time.perf_counter()
    cfg = RunConfig.from_flower(config, drop_unused=True)
    out = run_inprocess(cfg, cell.num_nodes) if cell.cohort == 1 else \
        run_cohort(cfg, cell.num_nodes, cell.cohort)
    return summarise(cell, out, time.perf_counter() - started)


def summarise(cell: Cell, out: Path, seconds: float) -> dict[str, Any]:
    """The table row: the run config, final and per-round metrics (numbers only)."""
    import csv

    with (out / "metrics.csv").open(newline="") as fh:
        table = list(csv.DictReader(fh))
    rounds = [r for r in table if int(r["round"]) >= 1]  # 0: the initial model
    initial = next((r for r in table if int(r["round"]) == 0), {})
    if not rounds:
        raise RuntimeError(f"{out} recorded no rounds")
    last = rounds[-1]
    row: dict[str, Any] = {"cell": cell.cell_id, "num-nodes": cell.num_nodes, **cell.run_config,
                           "rounds": len(rounds), "final-test-accuracy": float(last["test-accuracy"]),
                           "final-test-loss": float(last["test-loss"]),
                           "seconds": round(seconds, 2), "run-dir": str(out)}
    for metric in ("test-perplexity", "test-response-nll"):  # SFT tasks (docs/llm-lora.md)
        if last.get(metric):
            row[f"final-{metric}"] = float(last[metric])
    if initial.get("test-response-nll"):  # SFT: the pretrained model's Table 11 metrics too
        for metric in SFT_METRICS:
            row[f"initial-{metric}"] = float(initial[metric])
    for metric in rounds[0]:
        values = [_number(r.get(metric, "")) for r in rounds]
        if metric != "round" and any(v is not None for v in values):
            row[SERIES_PREFIX + metric] = values
    return row


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None  # booleans ("skipped") and blanks are not series


def _worker_init() -> None:
    import torch

    torch.set_num_threads(1)
    logging.basicConfig(level=logging.WARNING)


def _run_in_worker(args: tuple[Cell, Path]) -> dict[str, Any]:
    return run_cell(*args)


def _results(todo: list[Cell], results_dir: Path, jobs: int,
             runner: CellRunner) -> Iterator[dict[str, Any]]:
    if jobs == 1:
        for cell in todo:
            yield runner(cell, results_dir)
        return
    # spawn: a fresh interpreter per worker (fork would copy torch's thread pools).
    with multiprocessing.get_context("spawn").Pool(jobs, initializer=_worker_init) as pool:
        yield from pool.imap_unordered(_run_in_worker, [(c, results_dir) for c in todo])


def run_sweep(grid: Grid, results_dir: Path, jobs: int = 1, runner: CellRunner = run_cell,
              out: Any = sys.stderr) -> int:
    """Run the grid's unfinished cells; returns how many ran. `runner` replaces `run_cell`
    in-process (jobs=1) for tests."""
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    table = results_dir / f"{grid.name}.csv"
    done = finished_cells(table)
    cells = grid.cells()
    todo = [c for c in cells if c.cell_id not in done]
    if grid.skipped_algorithms:
        print(f"{grid.name}: skipping algorithms not in the catalog: {grid.skipped_algorithms}", file=out)
    print(f"{grid.name}: {len(cells)} cells, {len(cells) - len(todo)} already in {table}, "
          f"{len(todo)} to run with {jobs} job(s)", file=out)
    finished = 0
    # tqdm draws the bar (elapsed, ETA) on a terminal; each finished cell also gets one line.
    with tqdm(total=len(todo), desc=grid.name, unit="cell", file=out, disable=not todo) as bar:
        for row in _results(todo, results_dir, jobs, runner):
            append_row(table, row)
            finished += 1
            bar.write(f"{finished}/{len(todo)} {row['algorithm']} α={row['dirichlet-alpha']} "
                      f"p={row['fraction-train']} seed={row['seed']}: acc "
                      f"{row['final-test-accuracy']:.4f} ({row['seconds']:.0f} s)", file=out)
            bar.update()
    return finished


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("grids", nargs="+", type=Path, help="grid TOML files")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (one torch thread each)")
    parser.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS_DIR)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    for path in args.grids:
        run_sweep(load_grid(path, set(catalog())), args.results_dir.resolve(), args.jobs)


if __name__ == "__main__":
    main()
