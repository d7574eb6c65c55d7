"""`mypy --strict` on the package may only lose errors (a ratchet; docs/contributing.md, "Before a
commit"): the count is recorded here, a change that adds one fails, and one that removes some
must lower the number. Plain `python -m mypy` (pyproject's settings) stays clean on its own.

The strict run keeps its own cache (.mypy_cache/strict): the plain run's options differ, and
one shared cache would be rebuilt by each in turn. Measured on this project's 2-core machine at
load ~8: 180 s from no cache (a fresh clone, CI: hence `slow`), 9 s with it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mypy")

REPO = Path(__file__).resolve().parents[2]
# none left: the bound stays 0
STRICT_ERRORS = 0


def strict_errors() -> tuple[int, str]:
    """(the number of errors `mypy --strict adaptfl` reports, its output)."""
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(REPO / ".mypy_cache" / "strict"),
         "adaptfl"],
        cwd=REPO, capture_output=True, text=True, timeout=1800,
    )
    out = done.stdout + done.stderr
    if done.returncode == 0 and "Success: no issues found" in out:
        return 0, out
    found = re.search(r"^Found (\d+) errors? in \d+ files?", out, re.MULTILINE)
    assert found is not None, f"mypy did not report a count (exit {done.returncode}): {out[-3000:]}"
    return int(found.group(1)), out


@pytest.mark.slow
def test_strict_errors_only_fall() -> None:
    count, out = strict_errors()
    errors = "\n".join(line for line in out.splitlines() if ": error:" in line)
    assert count <= STRICT_ERRORS, \
        f"mypy --strict: {count} errors, the recorded bound is {STRICT_ERRORS}; fix the new ones:\n{errors}"
    assert count == STRICT_ERRORS, \
        f"mypy --strict: {count} errors now: lower STRICT_ERRORS from {STRICT_ERRORS} to {count}"
