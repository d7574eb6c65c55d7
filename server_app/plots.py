"""A run's figures: `plot.png` (accuracy and loss per round, from the initial model at round 0)
and `diagnostics.png` (the papers' per-round diagnostics the run recorded: direction
consistency, PosRatio, TopMass, preconditioner drift)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

DIAGNOSTICS = (("direction-consistency", "direction consistency (mean cos Δ_i, mean Δ)"),
               ("pos-ratio", "PosRatio (share of s = u ⊙ g > 0)"),
               ("top-mass", "TopMass₀.₀₁ (positive score mass in the top 1%)"),
               ("preconditioner-drift", "preconditioner drift (mean ‖Θ_i - Θ̄‖²)"),
               ("dp-epsilon", "privacy spent ε (at dp-delta)"))


def _series(rows: Sequence[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    pairs = [(int(r["round"]), float(r[key])) for r in rows if r.get(key) not in (None, "")]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def plot_run(rows: Sequence[dict[str, Any]], out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (ax_acc, ax_loss) = plt.subplots(1, 2, figsize=(11, 4))
    ax_acc.plot(*_series(rows, "test-accuracy"), marker="o")
    ax_acc.set(xlabel="round (0: the initial model)", ylabel="test accuracy", title="central test accuracy")
    ax_loss.plot(*_series(rows, "test-loss"), marker="o", label="test")
    ax_loss.plot(*_series(rows, "train-loss"), marker="x", label="train (clients' mean)")
    ax_loss.set(xlabel="round (0: the initial model)", ylabel="loss", title="loss")
    ax_loss.legend()
    for ax in (ax_acc, ax_loss):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # rounds are whole numbers
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out / "plot.png", dpi=100)
    plt.close(fig)

    present = [(k, label) for k, label in DIAGNOSTICS if _series(rows, k)[0]]
    if not present:
        return
    fig, axes = plt.subplots(1, len(present), figsize=(4.2 * len(present), 3.6), squeeze=False)
    for ax, (key, label) in zip(axes[0], present, strict=True):
        ax.plot(*_series(rows, key), marker="o")
        ax.set(xlabel="round", title=label)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out / "diagnostics.png", dpi=100)
    plt.close(fig)
