"""The package's own type check is `mypy --strict` (pyproject's [tool.mypy] strict = true, run by
.ci/run's mypy stage with zero errors allowed): a change that turned it off would let untyped
calls, bare generics and Any-returns back in unseen."""

from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_package_is_type_checked_strictly() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]
    assert config.get("strict") is True and config.get("packages") == ["adaptfl"], config
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert "python -m mypy" in ci and "--no-strict" not in ci
