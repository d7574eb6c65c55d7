"""The sweep runner: grid parsing, one row per cell, resuming after an interruption, parallel jobs."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from adaptfl.harness.grid import Cell, parse_grid
from adaptfl.harness.sweep import run_cell, run_sweep
from adaptfl.harness.table import read_table, series

TINY_GRID = """
[sweep]
name = "tiny"
num-nodes = 2
algorithms = ["fedavg", "not-landed-yet"]
dirichlet-alpha = [0.5]
fraction-train = [1.0]
seeds = [0, 1, 2]
[fixed]
model = "mlp"
num-server-rounds = 2
local-steps = 1
batch-size = 8
accept-small-rounds = true  # two nodes: rounds of two, accepted by name
"""


def test_grid_cells_and_unknown_algorithms() -> None:
    grid = parse_grid(TINY_GRID, known_algorithms={"fedavg"})
    assert grid.skipped_algorithms == ["not-landed-yet"]
    cells = grid.cells()
    assert [c.axes["seed"] for c in cells] == [0, 1, 2]
    assert cells[0].run_config == {"model": "mlp", "num-server-rounds": 2, "local-steps": 1,
                                   "batch-size": 8, "accept-small-rounds": True, "algorithm": "fedavg",
                                   "dirichlet-alpha": 0.5, "fraction-train": 1.0, "seed": 0}
    assert len({c.cell_id for c in cells}) == 3
    again = Cell(dict(reversed(cells[0].axes.items())), cells[0].fixed, 2)
    assert again.cell_id == cells[0].cell_id  # key order does not matter


@pytest.mark.parametrize("edit, message", [
    (("local-steps = 1", "local-stepz = 1"), "local-stepz"),
    (("seeds = [0, 1, 2]", "seeds = []"), "seeds"),
    (("model = \"mlp\"", "seed = 3"), "grid axes"),
    (("seeds = [0, 1, 2]", "seeds = [0]\ncohort = 0"), "cohort"),
    (("seeds = [0, 1, 2]", "seeds = [0]\ncohort = \"auto\""), "cohort"),
    (("seeds = [0, 1, 2]", "seeds = [0]\ncohrt = 2"), "unknown \\[sweep\\] keys \\['cohrt'\\]"),
])
def test_bad_grids_are_refused_naming_the_problem(edit: tuple[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_grid(TINY_GRID.replace(*edit), known_algorithms={"fedavg"})


def test_a_cohort_grid_trains_its_cells_together(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`cohort = C` reaches the engine's run_cohort, and names its own cells (equal to one at a
    time only to float round-off); cohort 1 keeps the one-at-a-time cells' ids."""
    import adaptfl.engine.cohort as cohort_module
    import adaptfl.harness.sweep as sweep_module

    alone = parse_grid(TINY_GRID, {"fedavg"}).cells()[0]
    together = parse_grid(TINY_GRID.replace("seeds = [0, 1, 2]", "seeds = [0, 1, 2]\ncohort = 2"),
                          {"fedavg"}).cells()[0]
    assert together.cohort == 2 and together.cell_id != alone.cell_id
    assert parse_grid(TINY_GRID.replace("seeds = [0, 1, 2]", "seeds = [0, 1, 2]\ncohort = 1"),
                      {"fedavg"}).cells()[0].cell_id == alone.cell_id
    calls: list[tuple[int, int | None]] = []
    monkeypatch.setattr(cohort_module, "run_cohort",
                        lambda cfg, nodes, size, form="auto": calls.append((nodes, size)) or tmp_path)
    monkeypatch.setattr(sweep_module, "summarise", lambda cell, out, seconds: {"out": out})
    assert run_cell(together, tmp_path) == {"out": tmp_path} and calls == [(2, 2)]


@pytest.mark.slow
def test_interrupted_sweep_resumes_without_redoing_cells(tmp_path: Path) -> None:
    grid = parse_grid(TINY_GRID, known_algorithms={"fedavg"})
    calls: list[str] = []

    def interrupted_on_second(cell: Cell, results_dir: Path) -> dict[str, Any]:
        if len(calls) == 1:
            raise KeyboardInterrupt  # Ctrl-C during the second cell
        calls.append(cell.cell_id)
        return run_cell(cell, results_dir)

    with pytest.raises(KeyboardInterrupt):
        run_sweep(grid, tmp_path, runner=interrupted_on_second, out=io.StringIO())
    table = tmp_path / "tiny.csv"
    first = read_table(table)
    assert [r["cell"] for r in first] == calls

    reran: list[str] = []

    def counting(cell: Cell, results_dir: Path) -> dict[str, Any]:
        reran.append(cell.cell_id)
        return run_cell(cell, results_dir)

    assert run_sweep(grid, tmp_path, runner=counting, out=io.StringIO()) == 2
    assert calls[0] not in reran
    rows = read_table(table)
    assert sorted(r["cell"] for r in rows) == sorted(c.cell_id for c in grid.cells())
    assert rows[0] == first[0]  # the finished row was not rewritten
    assert run_sweep(grid, tmp_path, runner=counting, out=io.StringIO()) == 0 and len(reran) == 2
    assert len(series(rows[1], "test-accuracy")) == 2 and float(rows[1]["rounds"]) == 2
    assert rows[1]["model"] == "mlp" and rows[1]["seed"] == "1"
    # a cell draws no figures unless the grid asks for them
    run_dir = Path(rows[1]["run-dir"])
    assert not list(run_dir.glob("*.png")) and (run_dir / "metrics.csv").exists()


@pytest.mark.slow
def test_a_grid_that_asks_for_figures_gets_them(tmp_path: Path) -> None:
    one_round = TINY_GRID.replace("num-server-rounds = 2", "num-server-rounds = 1\nfigures = true")
    grid = parse_grid(one_round.replace("[0, 1, 2]", "[0]"), known_algorithms={"fedavg"})
    assert run_sweep(grid, tmp_path, out=io.StringIO()) == 1
    assert (Path(read_table(tmp_path / "tiny.csv")[0]["run-dir"]) / "plot.png").exists()


@pytest.mark.slow
def test_parallel_jobs_fill_the_same_table(tmp_path: Path) -> None:
    grid = parse_grid(TINY_GRID.replace("[0, 1, 2]", "[5, 6]").replace("num-server-rounds = 2",
                                                                         "num-server-rounds = 1"),
                      known_algorithms={"fedavg"})
    log = io.StringIO()
    assert run_sweep(grid, tmp_path, jobs=2, out=log) == 2
    rows = read_table(tmp_path / "tiny.csv")
    assert sorted(r["seed"] for r in rows) == ["5", "6"]
    assert "2/2" in log.getvalue()  # the progress line


def test_sft_rows_keep_the_pretrained_models_metrics(tmp_path: Path) -> None:
    """An SFT run's row (docs/llm-lora.md) holds round 0's four Table 11 metrics as initial-*,
    the last round's as final-*; other tasks' rows get no initial-* columns."""
    from adaptfl.harness.sweep import summarise

    cell = parse_grid(TINY_GRID, {"fedavg"}).cells()[0]
    header = "round,test-accuracy,test-loss,test-perplexity,test-response-nll\n"
    (tmp_path / "metrics.csv").write_text(header + "0,0.5,0.9,2.4596,0.8\n1,0.6,0.7,2.0138,0.6\n"
                                          "2,0.7,0.5,1.6487,0.4\n")
    row = summarise(cell, tmp_path, 1.0)
    assert (row["initial-test-loss"], row["initial-test-perplexity"], row["initial-test-accuracy"],
            row["initial-test-response-nll"]) == (0.9, 2.4596, 0.5, 0.8)
    assert (row["final-test-loss"], row["final-test-response-nll"], row["rounds"]) == (0.5, 0.4, 2)
    (tmp_path / "metrics.csv").write_text("round,test-accuracy,test-loss\n0,0.5,0.9\n1,0.6,0.7\n")
    assert not any(k.startswith("initial-") for k in summarise(cell, tmp_path, 1.0))
