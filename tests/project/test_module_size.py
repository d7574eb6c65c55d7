"""No package module over 400 lines (docs/contributing.md, "Before a commit"): a module that
grows past it is split, as strategies/base.py was into base, broadcast and aggregation. The
modules over it today are listed with their length, to be split: the list may only shrink (a
listed module that grows, or a new one over the limit, fails; one that fell within it must
leave the list)."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "adaptfl"
LIMIT = 400
# path under adaptfl/ -> its lines when listed; each one a module to split, not a licence
OVER_THE_LIMIT: dict[str, int] = {}


def lengths(root: Path = PACKAGE) -> dict[str, int]:
    """path under `root` -> its line count, for every Python module over LIMIT."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > LIMIT:
            found[path.relative_to(root).as_posix()] = lines
    return found


def test_no_module_over_the_limit_but_the_listed_ones() -> None:
    found = lengths()
    new = {k: v for k, v in found.items() if k not in OVER_THE_LIMIT}
    grown = {k: (OVER_THE_LIMIT[k], v) for k, v in found.items()
             if k in OVER_THE_LIMIT and v > OVER_THE_LIMIT[k]}
    fixed = sorted(set(OVER_THE_LIMIT) - set(found))
    assert not new, f"modules over {LIMIT} lines (split them): {new}"
    assert not grown, f"listed modules grew (listed, now): {grown}"
    assert not fixed, f"within {LIMIT} lines now: take them off OVER_THE_LIMIT: {fixed}"


def test_a_long_module_is_found(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "long.py").write_text("x = 1\n" * (LIMIT + 1))
    (tmp_path / "short.py").write_text("x = 1\n" * LIMIT)
    assert lengths(tmp_path) == {"pkg/long.py": LIMIT + 1}
