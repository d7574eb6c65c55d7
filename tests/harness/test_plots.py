"""A run's figures show every title whole: no text runs off the figure's edge (the right-hand
panel's title of diagnostics.png did: tight_layout makes room for a title's height, not its width)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from adaptfl.server_app import plots  # noqa: E402

ROWS = [{"round": r, "test-accuracy": 0.1 * r, "test-loss": 2.0 - 0.1 * r, "train-loss": 2.1 - 0.1 * r,
         "direction-consistency": 0.5, "pos-ratio": 0.6, "top-mass": 0.2, "preconditioner-drift": 1e-3}
        for r in range(4)]
TITLE = "fedact-20261201-161228-17663"


def texts_outside(fig) -> list[str]:  # noqa: ANN001 - a matplotlib Figure
    """The titles whose drawn box leaves the figure (in pixels, 1 px of slack)."""
    renderer = fig.canvas.get_renderer()
    fig.canvas.draw()
    frame = fig.bbox
    texts = [ax.title for ax in fig.axes] + [fig._suptitle]
    return [t.get_text() for t in texts if t is not None and t.get_text() and (
        (box := t.get_window_extent(renderer)).x0 < frame.x0 - 1 or box.x1 > frame.x1 + 1
        or box.y0 < frame.y0 - 1 or box.y1 > frame.y1 + 1)]


# What different algorithms record: all four, FedACT's three (no drift), two, one.
WITHOUT = [(), ("preconditioner-drift",), ("preconditioner-drift", "direction-consistency"),
           ("pos-ratio", "top-mass", "preconditioner-drift")]


def rows_without(keys: tuple[str, ...]) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in keys} for row in ROWS]


def test_the_run_figure_fits() -> None:
    fig = plots.run_figure(ROWS, TITLE)
    try:
        assert len(fig.axes) == 2 and texts_outside(fig) == []
    finally:
        plt.close(fig)


def test_accuracy_against_the_bytes_moved() -> None:
    """With bytes in the rows (not under dp: they are not released) a third panel plots the
    accuracy after each round against the MB moved so far, both directions."""
    rows = [{**r, "bytes-down": 2e6, "bytes-up": 1e6} if r["round"] else r for r in ROWS]
    assert plots.cumulative_mb(rows) == ([0.0, 3.0, 6.0, 9.0], [0.0, 0.1, 0.2, 0.30000000000000004])
    assert plots.cumulative_mb(ROWS) == ([], [])
    fig = plots.run_figure(rows, TITLE)
    try:
        assert len(fig.axes) == 3 and texts_outside(fig) == []
        line = fig.axes[2].lines[0]
        assert list(line.get_xdata()) == [0.0, 3.0, 6.0, 9.0]
    finally:
        plt.close(fig)


@pytest.mark.parametrize("without", WITHOUT)
def test_every_diagnostics_title_fits(without: tuple[str, ...]) -> None:
    fig = plots.diagnostics_figure(rows_without(without), TITLE)
    try:
        assert len(fig.axes) == 4 - len(without) and texts_outside(fig) == []
    finally:
        plt.close(fig)


def test_the_check_sees_a_title_that_runs_off(monkeypatch) -> None:
    monkeypatch.setattr(plots, "PANEL_TITLE_CHARS", 1000)  # no wrapping: as before the fix
    fig = plots.diagnostics_figure(rows_without(WITHOUT[1]), TITLE)  # FedACT's three panels
    try:
        assert any("TopMass" in t for t in texts_outside(fig)), texts_outside(fig)
    finally:
        plt.close(fig)
