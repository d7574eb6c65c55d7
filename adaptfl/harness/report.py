"""`python -m adaptfl.harness.report grid.toml ... --out docs/results.md`: tables and PNG plots from the
results tables of sweeps (harness/sweep.py), one section per grid. `--splice` puts the sections
into an existing page instead (grids that `harness.reproduce` does not sweep, e.g. fedact-lora).

Per grid: final accuracy / loss (mean ± std over seeds), rounds to a target accuracy, bytes per
round, direction consistency, whether the paper's claimed ordering holds, and curves of
accuracy, loss, direction consistency and any drift metric versus round.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from adaptfl.algorithms.catalog import catalog
from adaptfl.harness.claims import check_claim
from adaptfl.harness.grid import Grid, load_grid
from adaptfl.harness.stats import Row, curve, final, group, last_round, mean_per_round, rounds_to_target
from adaptfl.harness.sweep import DEFAULT_RESULTS_DIR
from adaptfl.harness.table import SERIES_PREFIX, read_table

TARGET_SHARE = 0.95  # default target: 95% of the best mean final accuracy within the setting
CURVES = ("test-accuracy", "test-loss", "direction-consistency")
TARGETS = ("test-accuracy", "test-loss")  # a grid's [paper] target = "test-loss": within 5% of the best loss


def target_accuracy(by_algorithm: dict[str, list[Row]]) -> float:
    best = max(final(rows, "final-test-accuracy").mean for rows in by_algorithm.values())
    return round(TARGET_SHARE * best, 4)


def target_value(by_algorithm: dict[str, list[Row]], metric: str) -> float:
    """95% of the best mean final accuracy, or 1/0.95 of the best (lowest) mean final loss."""
    if metric == "test-accuracy":
        return target_accuracy(by_algorithm)
    best = min(final(rows, f"final-{metric}").mean for rows in by_algorithm.values())
    return round(best / TARGET_SHARE, 4)


def results_table(rows: list[Row], target: str = "test-accuracy") -> str:
    """The Markdown table of one grid: one line per (setting, algorithm); rounds to target on
    test accuracy (default) or test loss."""
    if target not in TARGETS:
        raise ValueError(f"[paper] target={target!r}: choose one of {list(TARGETS)}")
    sign = "≤" if target == "test-loss" else "≥"
    lines = ["| α | participation | algorithm | seeds | final test accuracy | final test loss | "
             f"rounds to target {target.removeprefix('test-')} (reached) | MB down / up per round | "
             "direction consistency (last) |",
             "|---|---|---|---|---|---|---|---|---|"]
    if target == "test-accuracy":  # the header the pages had before loss targets existed
        lines[0] = lines[0].replace("rounds to target accuracy (reached)", "rounds to target (reached)")
    for (alpha, fraction), by_algorithm in group(rows).items():
        goal = target_value(by_algorithm, target)
        for algorithm, runs in by_algorithm.items():
            rounds, reached = rounds_to_target(runs, goal, target)
            rounds_text = f"{rounds.mean:.1f} ({reached}/{len(runs)} {sign} {goal:.3f})" if reached \
                else f"– (0/{len(runs)} {sign} {goal:.3f})"
            down = mean_per_round(runs, "bytes-down").mean / 1e6
            up = mean_per_round(runs, "bytes-up").mean / 1e6
            dc = last_round(runs, "direction-consistency")
            lines.append(f"| {alpha:g} | {fraction:g} | {algorithm} | {len(runs)} | "
                         f"{final(runs, 'final-test-accuracy')} | {final(runs, 'final-test-loss')} | "
                         f"{rounds_text} | {down:.3f} / {up:.3f} | "
                         f"{'–' if math.isnan(dc.mean) else f'{dc.mean:.3f}'} |")
    return "\n".join(lines)


SFT_COLUMNS = {"test-loss": "held-out loss", "test-perplexity": "perplexity",
               "test-accuracy": "token accuracy", "test-response-nll": "response NLL"}


def sft_table(rows: list[Row]) -> str:
    """Table 11 of seed 000 for SFT grids (docs/llm-lora.md): the four held-out metrics of the
    model before training (round 0, one value per seed) and after the last round."""
    lines = ["| α | participation | model | seeds | " + " | ".join(SFT_COLUMNS.values()) + " |",
             "|---|---|---|---|---|---|---|---|"]
    for (alpha, fraction), by_algorithm in group(rows).items():
        by_seed = {r["seed"]: r for runs in by_algorithm.values() for r in runs}  # one per seed
        if all(r.get(f"initial-{m}") for r in by_seed.values() for m in SFT_COLUMNS):
            values = [str(final(list(by_seed.values()), f"initial-{m}")) for m in SFT_COLUMNS]
            lines.append(f"| {alpha:g} | {fraction:g} | pretrained (round 0) | {len(by_seed)} | "
                         + " | ".join(values) + " |")
        for algorithm, runs in by_algorithm.items():
            values = [str(final(runs, f"final-{m}")) for m in SFT_COLUMNS]
            lines.append(f"| {alpha:g} | {fraction:g} | {algorithm} | {len(runs)} | "
                         + " | ".join(values) + " |")
    return "\n".join(lines)


def claim_lines(paper: dict[str, Any], rows: list[Row]) -> list[str]:
    """The claim checked on `metric`, or on each of `metrics` (a list) when the grid names several."""
    metrics = paper.get("metrics") or [paper.get("metric", "final-test-accuracy")]
    parts: list[str] = []
    for metric in metrics:
        check = check_claim({**paper, "metric": metric}, rows)
        if check is None:
            continue
        head = "**Does the ordering hold?**" + (f" On {metric}:" if len(metrics) > 1 else "")
        parts += [f"{head} {check.verdict}", ""]
        parts += [f"- α={c.setting[0]:g}, p={c.setting[1]:g}: {c.winner} {c.winner_value} vs "
                  f"{c.loser} {c.loser_value} ({metric}; "
                  f"gain in the claim's direction {c.gain:+.4f})" for c in check.comparisons]
        parts.append("")
    return parts


def drift_metrics(rows: list[Row]) -> list[str]:
    """Per-round series whose name says drift (e.g. FedPAC's preconditioner drift), if any."""
    names = {k.removeprefix(SERIES_PREFIX) for r in rows for k, v in r.items()
             if k.startswith(SERIES_PREFIX) and "drift" in k and v}
    return sorted(names)


def plot_grid(name: str, rows: list[Row], path: Path) -> None:
    """One row of panels per setting: accuracy, loss, direction consistency (+ drift)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = [*CURVES, *drift_metrics(rows)]
    settings = group(rows)
    fig, axes = plt.subplots(len(settings), len(metrics), squeeze=False,
                             figsize=(3.2 * len(metrics), 2.6 * len(settings)))
    for row_axes, ((alpha, fraction), by_algorithm) in zip(axes, settings.items(), strict=True):
        for ax, metric in zip(row_axes, metrics, strict=True):
            for algorithm, runs in by_algorithm.items():
                mean, std = curve(runs, metric)
                if not mean:
                    continue
                rounds = range(1, len(mean) + 1)
                ax.plot(rounds, mean, label=algorithm, linewidth=1.2)
                ax.fill_between(rounds, [m - s for m, s in zip(mean, std, strict=True)],
                                [m + s for m, s in zip(mean, std, strict=True)], alpha=0.2)
            ax.set_title(f"{metric}\nα={alpha:g}, p={fraction:g}", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.set_xlabel("round", fontsize=7)
        row_axes[0].legend(fontsize=6)
    fig.suptitle(f"{name}: mean ± std over seeds", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=72)
    plt.close(fig)


def grid_section(grid: Grid, rows: list[Row], plot_dir: Path, page_dir: Path) -> str:
    """A Markdown section for one grid (the page links the PNG relative to `page_dir`)."""
    paper = grid.paper
    title = paper.get("title", grid.name) + (f" (seed {paper['seed']})" if "seed" in paper else "")
    parts = [f"## {title}", ""]
    if paper.get("claim"):
        parts += [f"**Claim.** {paper['claim']}", ""]
    if grid.skipped_algorithms:
        parts += [f"Not run: {', '.join(grid.skipped_algorithms)} (not in `algorithms/catalog.py` "
                  "when this page was generated; rerun the command once they land).", ""]
    if not rows:
        return "\n".join(parts + ["No results yet.", ""])
    fixed = ", ".join(f"`{k}={v}`" for k, v in grid.fixed.items())
    seeds = len(grid.seeds)
    together = f"; each round's clients trained {grid.cohort} at a time (`--cohort {grid.cohort}`, " \
        "docs/scale.md)" if grid.cohort > 1 else ""
    parts += [f"**Setting.** {grid.num_nodes} clients, {fixed}; {seeds} seeds per cell{together}.", ""]
    if paper.get("scale"):
        parts += [f"**Scale.** {paper['scale']}", ""]
    parts += [results_table(rows, paper.get("target", "test-accuracy")), ""]
    if all(r.get("final-test-response-nll") for r in rows):  # SFT: Table 11's four metrics
        parts += [sft_table(rows), ""]
    parts += claim_lines(paper, rows)
    plot = plot_dir / f"{grid.name}.png"
    plot_grid(grid.name, rows, plot)
    parts += [f"![{grid.name}]({plot.relative_to(page_dir)})", ""]
    return "\n".join(parts)


def render(grid_paths: list[Path], results_dir: Path, out: Path) -> str:
    """The whole page body for these grids (also writes the PNGs next to `out`)."""
    sections = []
    for path in grid_paths:
        grid = load_grid(path, set(catalog()))
        known = {c.cell_id for c in grid.cells()}
        rows = [r for r in read_table(results_dir / f"{grid.name}.csv") if r["cell"] in known]
        sections.append(grid_section(grid, rows, out.parent / "results-data", out.parent))
    return "\n".join(sections)


def held_line(grid: Grid, rows: list[Row]) -> str:
    """The grid's line under "Which claims held" (on `metric`, the headline one of `metrics`)."""
    paper = grid.paper
    title = paper.get("title", grid.name) + (f" (seed {paper['seed']})" if "seed" in paper else "")
    check = check_claim(paper, rows)
    if check is None:
        return (f"- {title}: not tested — its algorithms "
                f"({', '.join(grid.skipped_algorithms) or 'none'}) have not landed.")
    on = f"on {paper['metric']}, " if len(paper.get("metrics") or []) > 1 else ""
    return f"- {title}: {on}{check.verdict}"


def splice_held(page: str, line: str) -> str:
    """The page with `line` replacing the same grid's line under "## Which claims held" (or
    added after that list's last line); unchanged when the page has no such list."""
    head = "## Which claims held"
    lines = page.split("\n")
    if head not in lines:
        return page
    start = lines.index(head)
    prefix = line.split(": ")[0] + ": "
    same = [i for i in range(start, len(lines)) if lines[i].startswith(prefix)]
    if same:
        lines[same[0]] = line
    else:
        last = max((i for i in range(start, len(lines)) if lines[i].startswith("- ")), default=start + 1)
        lines.insert(last + 1, line)
    return "\n".join(lines)


def marked(name: str, section: str) -> str:
    """A grid's section between markers, so that `splice` can replace it in a whole page."""
    return f"<!-- grid {name} -->\n{section.rstrip()}\n<!-- end of grid {name} -->\n"


def splice(page: str, name: str, section: str) -> str:
    """The page with grid `name`'s marked section replaced, or inserted before the privacy
    section (or "## Systems", or the end): grids that `harness.reproduce` does not sweep."""
    start, end = f"<!-- grid {name} -->", f"<!-- end of grid {name} -->\n"
    new = marked(name, section)
    if start in page:
        a, b = page.index(start), page.index(end) + len(end)
        return page[:a] + new + page[b:]
    at = next((page.index(m) for m in ("<!-- privacy section -->", "## Systems") if m in page),
              len(page))
    return page[:at] + new + "\n" + page[at:]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("grids", nargs="+", type=Path)
    parser.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS_DIR)
    parser.add_argument("--out", type=Path, default=Path("docs/results.md"))
    parser.add_argument("--splice", action="store_true",
                        help="replace (or add) these grids' sections in the existing page and copy "
                             "their tables to results-data/, instead of writing a new page")
    args = parser.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    out = args.out.resolve()
    if not args.splice:
        args.out.write_text("# Results\n\n" + render(args.grids, args.results_dir, out))
        print(f"wrote {args.out}")
        return
    page = args.out.read_text()
    for path in args.grids:
        grid = load_grid(path, set(catalog()))
        name, known = grid.name, {c.cell_id for c in grid.cells()}
        page = splice(page, name, render([path], args.results_dir, out))
        rows = [r for r in read_table(args.results_dir / f"{name}.csv") if r["cell"] in known]
        page = splice_held(page, held_line(grid, rows))
        table = args.results_dir / f"{name}.csv"
        (out.parent / "results-data").mkdir(exist_ok=True)
        (out.parent / "results-data" / table.name).write_text(table.read_text())
    args.out.write_text(page)
    print(f"wrote the sections of {', '.join(p.stem for p in args.grids)} into {args.out}")


if __name__ == "__main__":
    main()
