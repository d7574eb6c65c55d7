"""A run's figures: `plot.png` (accuracy and loss per round, from the initial model at round 0)
and `diagnostics.png` (the papers' per-round diagnostics the run recorded: direction
consistency, PosRatio, TopMass, preconditioner drift)."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

PANEL_TITLE_CHARS = 30  # a 4.2-inch panel holds about this many characters of a 12 pt title
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

    fig = run_figure(rows, title)
    fig.savefig(out / "plot.png", dpi=100)
    plt.close(fig)
    fig = diagnostics_figure(rows, title)
    if fig is not None:
        fig.savefig(out / "diagnostics.png", dpi=100)
        plt.close(fig)


def run_figure(rows: Sequence[dict[str, Any]], title: str) -> Any:
    """plot.png: accuracy and loss per round."""
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
    return fig


def diagnostics_figure(rows: Sequence[dict[str, Any]], title: str) -> Any | None:
    """diagnostics.png: one panel per diagnostic the run recorded; None if it recorded none.
    The panel titles are wrapped to the panel's width: tight_layout makes room for a title's
    height, never for its width, so a long one ran off the figure's right edge."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    present = [(k, label) for k, label in DIAGNOSTICS if _series(rows, k)[0]]
    if not present:
        return None
    fig, axes = plt.subplots(1, len(present), figsize=(4.2 * len(present), 3.8), squeeze=False)
    for ax, (key, label) in zip(axes[0], present, strict=True):
        ax.plot(*_series(rows, key), marker="o")
        ax.set(xlabel="round", title=textwrap.fill(label, PANEL_TITLE_CHARS))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.suptitle(title)
    fig.tight_layout()
    return fig
