"""Every column a built-in run writes is declared in server_app/columns.py, and docs/metrics.md's
table is the declarations' (issue 33 §5: six columns were documented nowhere)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adaptfl.algorithms.config import RunConfig
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.server_app.columns import COLUMNS, JSONL, PAGE, column_table
from adaptfl.server_app.loop import run_federated

ROOT = Path(__file__).resolve().parents[2]
RUNS = {  # between them every family of columns: trust diagnostics, Θ sharing, HaFedHo, kept
    "fedact": {"diagnostics_every": 1},  # state, dp, the contribution clip, a skipped round
    "fedpac-sophia": {"light": True},
    "hafedho": {},
    "diloco": {},
    "fedavg": {"dp": "central", "weighting": "uniform", "dp_clip_lr": 0.2, "dp_count_stddev": 2.0,
               "dp_accept_epsilon": 1e3},
    "scaffold": {"max_contribution_ratio": 1.0, "max_weight_ratio": 1.5},
}


def test_the_docs_table_is_current() -> None:
    assert column_table() in (ROOT / PAGE).read_text(), "stale: run python scripts/regenerate_docs.py"


@pytest.mark.parametrize("algorithm", sorted(RUNS))
@pytest.mark.slow
def test_every_column_a_run_writes_is_declared(tiny_data, tmp_path, algorithm: str) -> None:
    cfg = RunConfig.of(algorithm=algorithm, model="mlp", num_server_rounds=2, local_steps=2,
                       data_dir=tiny_data["fashion-mnist"],
                       figures=False, results_dir=str(tmp_path), run_name="r",
                       client_state_dir=str(tmp_path / "state"), partitioning="dirichlet",
                       **RUNS[algorithm])
    out = run_federated(InProcessGrid(3, cfg.to_flower()), cfg)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    undeclared = sorted({k for row in rows for k in row} - set(COLUMNS))
    assert not undeclared, f"declare {undeclared} in adaptfl/server_app/columns.py"
    csv_columns = (out / "metrics.csv").read_text().splitlines()[0].split(",")
    assert not [c for c in csv_columns if COLUMNS[c][0] == JSONL]  # nested ones stay in the JSONL
