"""A run's figures: `plot.png` (accuracy and loss per round, from the initial model at round 0,
and accuracy against the cumulative bytes on the wire, both directions) and `diagnostics.png`
(the papers' per-round diagnostics the run recorded: direction consistency, PosRatio, TopMass,
preconditioner drift)."""

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


def cumulative_mb(rows: Sequence[dict[str, Any]]) -> tuple[list[float], list[float]]:
    """(MB on the wire so far, both directions; test accuracy) after each round, round 0 at 0 MB;
    empty where the rows hold no bytes (under dp they are not released)."""
    if not any(r.get("bytes-down") not in (None, "") for r in rows):
        return [], []
    total, mb, accuracy = 0.0, [], []
    for r in rows:
        total += float(r.get("bytes-down") or 0) + float(r.get("bytes-up") or 0)
        if r.get("test-accuracy") not in (None, ""):
            mb.append(total / 1e6)
            accuracy.append(float(r["test-accuracy"]))
    return mb, accuracy


def run_figure(rows: Sequence[dict[str, Any]], title: str) -> Any:
    """plot.png: accuracy and loss per round; accuracy against the bytes moved."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    mb, accuracy = cumulative_mb(rows)
    fig, axes = plt.subplots(1, 3 if mb else 2, figsize=(16.5 if mb else 11, 4))
    ax_acc, ax_loss = axes[0], axes[1]
    if mb:
        axes[2].plot(mb, accuracy, marker="o")
        axes[2].set(xlabel="MB on the wire so far (down + up)", ylabel="test accuracy",
                    title="accuracy against communication")
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
