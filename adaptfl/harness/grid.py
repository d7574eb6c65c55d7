"""A sweep's grid, read from TOML: algorithms x dirichlet-alpha x fraction-train x seeds.

    [sweep]
    name = "fedact"                  # the results table is <results-dir>/<name>.csv
    num-nodes = 10
    algorithms = ["fedadamw", "fedact"]
    dirichlet-alpha = [0.1, 1.0]
    fraction-train = [1.0]
    seeds = [0, 1, 2]
    cohort = 10                      # optional: train each round's clients 10 at a time
    [fixed]                          # run-config keys shared by every cell
    num-server-rounds = 10
    [paper]                          # optional: what the report checks (harness/claims.py)
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adaptfl.algorithms.config import RunConfig

GRID_AXES = ("algorithm", "dirichlet-alpha", "fraction-train", "seed")
SWEEP_KEYS = ("name", "num-nodes", "algorithms", "dirichlet-alpha", "fraction-train", "seeds", "cohort")


@dataclass(frozen=True)
class Cell:
    """One run of the grid: the axes' values plus the fixed overrides."""

    axes: dict[str, Any]
    fixed: dict[str, Any]
    num_nodes: int
    cohort: int = 1  # the engine's --cohort: clients trained together (docs/scale.md)

    @property
    def run_config(self) -> dict[str, Any]:
        return {**self.fixed, **self.axes}

    @property
    def cell_id(self) -> str:
        """Stable over processes and key order: the hash of everything the run computes from."""
        run = {"config": self.run_config, "num-nodes": self.num_nodes}
        if self.cohort != 1:  # equal to one at a time only to float round-off: its own cell
            run["cohort"] = self.cohort
        blob = json.dumps(run, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def label(self) -> str:
        return (f"{self.axes['algorithm']} α={self.axes['dirichlet-alpha']} "
                f"p={self.axes['fraction-train']} seed={self.axes['seed']}")


@dataclass(frozen=True)
class Grid:
    name: str
    num_nodes: int
    algorithms: list[str]
    dirichlet_alphas: list[float]
    fraction_trains: list[float]
    seeds: list[int]
    fixed: dict[str, Any]
    paper: dict[str, Any] = field(default_factory=dict)
    cohort: int = 1
    skipped_algorithms: list[str] = field(default_factory=list)  # not in the catalog (yet)

    def cells(self) -> list[Cell]:
        return [Cell({"algorithm": algorithm, "dirichlet-alpha": alpha, "fraction-train": fraction,
                      "seed": seed}, self.fixed, self.num_nodes, self.cohort)
                for algorithm in self.algorithms for alpha in self.dirichlet_alphas
                for fraction in self.fraction_trains for seed in self.seeds]


def _list(section: dict[str, Any], key: str, kind: type) -> list[Any]:
    values = section.get(key)
    if not isinstance(values, list) or not values:
        raise ValueError(f"[sweep] {key} must be a non-empty list, got {values!r}")
    if kind is float:
        values = [float(v) if isinstance(v, int) and not isinstance(v, bool) else v for v in values]
    bad = [v for v in values if not isinstance(v, kind) or isinstance(v, bool)]
    if bad:
        raise ValueError(f"[sweep] {key} holds {bad!r}, expected {kind.__name__} values")
    return values


def _sweep_section(raw: dict[str, Any]) -> dict[str, Any]:
    """[sweep], its keys known and its cohort a count."""
    sweep = dict(raw.get("sweep", {}))
    stray = sorted(set(sweep) - set(SWEEP_KEYS))
    if stray:
        raise ValueError(f"unknown [sweep] keys {stray}; known: {', '.join(SWEEP_KEYS)}")
    cohort = sweep.get("cohort", 1)
    if not isinstance(cohort, int) or isinstance(cohort, bool) or cohort < 1:
        raise ValueError(f"[sweep] cohort must be a count >= 1, got {cohort!r}")
    return sweep


def parse_grid(text: str, known_algorithms: set[str] | None = None) -> Grid:
    """Parse and check a grid. Algorithms missing from `known_algorithms` are set aside in
    `skipped_algorithms` (a grid may name algorithms that land later); every cell's run
    config is validated by RunConfig now, so a typo fails before the first run."""
    raw = tomllib.loads(text)
    unknown = sorted(set(raw) - {"sweep", "fixed", "paper"})
    if unknown:
        raise ValueError(f"unknown grid sections {unknown}; known: sweep, fixed, paper")
    sweep, fixed = _sweep_section(raw), dict(raw.get("fixed", {}))
    clash = sorted(set(fixed) & set(GRID_AXES))
    if clash:
        raise ValueError(f"[fixed] sets grid axes {clash}; put them in [sweep]")
    name = sweep.get("name")
    if not isinstance(name, str) or not name.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"[sweep] name must be a plain word (it names the CSV), got {name!r}")
    algorithms = _list(sweep, "algorithms", str)
    known = [a for a in algorithms if known_algorithms is None or a in known_algorithms]
    grid = Grid(name=name, num_nodes=int(sweep.get("num-nodes", 10)), algorithms=known,
                dirichlet_alphas=_list(sweep, "dirichlet-alpha", float),
                fraction_trains=_list(sweep, "fraction-train", float), seeds=_list(sweep, "seeds", int),
                fixed=fixed, paper=dict(raw.get("paper", {})),
                skipped_algorithms=[a for a in algorithms if a not in known],
                cohort=sweep.get("cohort", 1))
    if grid.num_nodes < 1:
        raise ValueError(f"[sweep] num-nodes must be >= 1, got {grid.num_nodes}")
    for cell in grid.cells():  # raises naming a bad key; fixed keys apply where an algorithm reads them
        RunConfig.from_flower(cell.run_config, drop_unused=True)
    return grid


def load_grid(path: str | Path, known_algorithms: set[str] | None = None) -> Grid:
    return parse_grid(Path(path).read_text(), known_algorithms)
