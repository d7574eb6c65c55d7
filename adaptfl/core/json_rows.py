"""A metrics row as one line of strict JSON (RFC 8259 has no Infinity or NaN; Python's
`json.dumps` writes them by default, and a file holding them is not JSON to other readers).

A float that is not finite is written as null and its key path listed under `non-finite`, so a
reader sees that a value was there and what became of it; the dump itself refuses any non-finite
value left (`allow_nan=False`), so a row that slipped past fails the write instead of the reader.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

NON_FINITE = "non-finite"  # the row's column listing the key paths written as null


def _finite(value: Any, path: str, found: list[str]) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        found.append(path)
        return None
    if isinstance(value, Mapping):
        return {k: _finite(v, f"{path}/{k}" if path else str(k), found) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v, f"{path}/{i}", found) for i, v in enumerate(value)]
    return value


def json_line(row: Mapping[str, Any]) -> str:
    """`row` as one line of strict JSON with its newline (module docstring)."""
    found: list[str] = []
    clean = _finite(row, "", found)
    if found:
        clean[NON_FINITE] = found
    return json.dumps(clean, allow_nan=False) + "\n"
