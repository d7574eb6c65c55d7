"""No function of the core exceeds cyclomatic complexity 15 (radon's measure, as issue 30
measured it): the local step and the server's strategies stay readable as they grow."""

from __future__ import annotations

from pathlib import Path

import pytest

radon = pytest.importorskip("radon.complexity")  # in the test extra; skipped only outside it

PACKAGE = Path(__file__).resolve().parents[2] / "adaptfl"
LIMIT = 15


@pytest.mark.parametrize("part", ["local_update", "strategies"])
def test_no_function_above_the_limit(part: str) -> None:
    over: set[str] = set()  # a method is listed with its class and alone
    for path in sorted((PACKAGE / part).rglob("*.py")):
        for block in radon.cc_visit(path.read_text()):
            for item in [block, *getattr(block, "methods", [])]:
                if item.complexity > LIMIT and item.letter != "C":  # a class's own total is not a function's
                    over.add(f"{path.relative_to(PACKAGE)}:{item.lineno} {item.name} {item.complexity}")
    assert not over, f"complexity above {LIMIT} (split them): {sorted(over)}"
