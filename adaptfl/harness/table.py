"""The results table: one CSV row per finished cell, written only by the sweep's parent process.

Per-round series are JSON lists in their cells (`series:test-accuracy` = "[0.61, 0.74, ...]"),
so one row holds everything a report needs and the table stays one row per cell.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Any

SERIES_PREFIX = "series:"


def read_table(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        return []
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def finished_cells(path: Path) -> set[str]:
    return {row["cell"] for row in read_table(path)}


def append_row(path: Path, row: dict[str, Any]) -> None:
    """Append one row; when it brings new columns, rewrite the file with the union header
    (atomically: write a temp file, then rename), so an interrupt never leaves half a table."""
    rows = read_table(path)
    header = list(rows[0].keys()) if rows else []
    encoded = {k: _encode(v) for k, v in row.items()}
    if rows and set(encoded) <= set(header):
        with path.open("a", newline="") as fh:
            csv.DictWriter(fh, fieldnames=header).writerow(encoded)
        return
    header = list(dict.fromkeys([*header, *encoded]))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".csv.tmp")
    with tmp.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=header, restval="")
        writer.writeheader()
        writer.writerows([*rows, encoded])
    os.replace(tmp, path)


def _encode(value: Any) -> Any:
    return json.dumps(value) if isinstance(value, list | dict) else value


def series(row: dict[str, str], metric: str) -> list[float]:
    """The per-round values of `metric` in a table row ([] when the run did not report it)."""
    raw = row.get(SERIES_PREFIX + metric, "")
    return [float("nan") if v is None else float(v) for v in json.loads(raw)] if raw else []


def splice_section(page: str, new: str, start: str, end: str) -> str:
    """`page` with the section between the markers `start` and `end` replaced by `new` (a
    generated section of docs/results.md), or `new` inserted before "## Systems" if absent."""
    if start in page:
        a, b = page.index(start), page.index(end) + len(end) + 1
        return page[:a] + new + page[b:]
    at = page.index("## Systems") if "## Systems" in page else len(page)
    return page[:at] + new + "\n" + page[at:]
