"""What the run trains on, before round 1: the task's rows, classes and input, and each
partition's size and label skew, as one log line, `data-summary.json` and `partitions.png`
beside `plot.png` (like flwr-datasets' partition plots).

The partitions are those the clients cut from the task's data by their partition-id (the
simulation, the engine, a deployment whose nodes share the data set); a node with its own
`data-dir` trains on all of its own data, which the server never sees. Under dp the sizes and
label counts are each client's data: the summary then holds the task only.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch

from adaptfl.algorithms.config import RunConfig
from adaptfl.workloads import Task, partition_indices

log = logging.getLogger(__name__)
SUMMARY_FILE, PLOT_FILE = "data-summary.json", "partitions.png"
PLOTTED = 100  # partitions drawn at most (the JSON lists them all)


def summarize(task: Task, cfg: RunConfig, num_nodes: int) -> dict[str, Any]:
    """The task, and unless dp is on each partition's size and label counts; `skew` is the
    mean total-variation distance of a partition's label distribution from the whole set's
    (0: iid; 1: disjoint labels)."""
    labels = task.train.labels
    out: dict[str, Any] = {"task": task.name, "train-rows": len(task.train), "test-rows": len(task.test),
                           "outputs": task.num_outputs, "input-shape": list(task.input_shape),
                           "partitioning": cfg.data.partitioning, "partitions": num_nodes}
    if cfg.privacy.on or labels.is_floating_point():  # dp, or no classes to count
        return out
    classes = int(labels.max()) + 1 if len(labels) else 0
    overall = torch.bincount(labels, minlength=classes).double() / max(len(labels), 1)
    counts, distances = [], []
    for pid in range(num_nodes):
        idx = partition_indices(labels, num_nodes, pid, cfg.data.partitioning, cfg.data.dirichlet_alpha,
                                cfg.federation.seed, cfg.data.classes_per_client)
        own = torch.bincount(labels[idx], minlength=classes)
        counts.append(own.tolist())
        share = own.double() / max(int(own.sum()), 1)
        distances.append(0.5 * float((share - overall).abs().sum()))
    sizes = [sum(c) for c in counts]
    out.update({"sizes": sizes, "label-counts": counts, "skew": sum(distances) / len(distances)})
    return out


def summary_line(summary: dict[str, Any]) -> str:
    head = (f"data: {summary['task']}, {summary['train-rows']} train / {summary['test-rows']} test "
            f"rows, {summary['outputs']} outputs, input {tuple(summary['input-shape'])}; "
            f"{summary['partitions']} partitions ({summary['partitioning']})")
    if "sizes" not in summary:
        return head + ": sizes and label counts withheld under dp"
    sizes = summary["sizes"]
    return head + (f": {min(sizes)}-{max(sizes)} rows each, label skew {summary['skew']:.2f} "
                   "(mean total-variation distance from the whole set)")


def write_summary(summary: dict[str, Any], out_dir: Path, *, figure: bool) -> None:
    """The JSON, and (`figure`) the partitions' stacked label counts where there are any."""
    (out_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=1) + "\n")
    if not figure or "label-counts" not in summary:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = summary["label-counts"][:PLOTTED]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.12 * len(counts) + 2), 3.5))
    bottom = [0] * len(counts)
    for label in range(len(counts[0]) if counts else 0):
        heights = [c[label] for c in counts]
        ax.bar(range(len(counts)), heights, bottom=bottom, width=0.9, label=str(label))
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    shown = f" (first {PLOTTED} of {summary['partitions']})" if summary["partitions"] > PLOTTED else ""
    ax.set(xlabel=f"partition{shown}", ylabel="rows",
           title=f"{summary['task']}, {summary['partitioning']}: label counts per partition")
    if len(counts[0]) <= 20:
        ax.legend(title="label", fontsize="x-small", ncol=2, loc="upper right")
    fig.tight_layout()
    fig.savefig(out_dir / PLOT_FILE, dpi=100)
    plt.close(fig)
