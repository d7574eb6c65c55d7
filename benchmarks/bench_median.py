"""The contribution bound's cost a round (strategies/contribution.py: each reply clipped around the
round's coordinate-wise median), with the median sorted or selected.

    python benchmarks/bench_median.py [--replies 100] [--model cnn] [--repeats 2]

S synthetic replies of the model's shapes (random normal Δ, equal weights), one thread; each
repeat times `clip_contributions` once with the median by sorting every coordinate's S values
(the definition, as it was computed before) and once with `coordinate_median` (numpy's selection
of the middle values), in alternating order so that a load change hits both. Prints the seconds
of each, per reply, and the ratio of the medians, with the load average. Flower's FedAvg has no
such step: it is adaptfl's own per-reply cost on the server (docs/scale.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from adaptfl.server_rules.aggregators.median import coordinate_median  # noqa: E402
from adaptfl.strategies import contribution  # noqa: E402
from adaptfl.workloads.models import build_model  # noqa: E402


def sorted_median(values: torch.Tensor, reorder: bool = False) -> torch.Tensor:
    """The coordinate-wise median by a full sort of dim 0 (the definition)."""
    ordered = values.sort(dim=0).values
    n = ordered.shape[0]
    return ordered[n // 2] if n % 2 else 0.5 * (ordered[n // 2 - 1] + ordered[n // 2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replies", type=int, default=100)
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(1)
    shapes = {k: v.shape for k, v in build_model(args.model, 10, 1, 28).state_dict().items()}
    generator = torch.Generator().manual_seed(0)
    forms = {"sort": sorted_median, "select": coordinate_median}
    seconds: dict[str, list[float]] = {name: [] for name in forms}
    for repeat in range(args.repeats):
        for name in (["sort", "select"] if repeat % 2 == 0 else ["select", "sort"]):
            replies = [SimpleNamespace(arrays={"delta": {k: torch.randn(s, generator=generator)
                                                         for k, s in shapes.items()}})
                       for _ in range(args.replies)]
            contribution.coordinate_median = forms[name]  # what center() calls
            started = time.perf_counter()
            contribution.clip_contributions(replies, [1.0] * args.replies, 2.0, "delta")  # type: ignore[arg-type]
            seconds[name].append(time.perf_counter() - started)
    contribution.coordinate_median = coordinate_median
    each = {name: statistics.median(s) for name, s in seconds.items()}
    print(f"contribution bound, {args.replies} replies of the {args.model} "
          f"({sum(s.numel() for s in shapes.values()):,} numbers), {args.repeats} repeats each way: "
          + "; ".join(f"{name} {[round(s, 3) for s in seconds[name]]} s "
                      f"({1e3 * each[name] / args.replies:.1f} ms a reply)" for name in forms)
          + f"; select/sort {each['select'] / each['sort']:.2f}x; load {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
