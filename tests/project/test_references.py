"""Comments and docstrings cite a paper and its equation or a docs page, never the issue tracker
("issue 21 §3", "issue #7") or the sections of the project's internal spec ("spec §3"): neither
ships with the package, so a reader cannot follow them (docs/contributing.md, "Before a
commit"). The files that
still hold such references are listed: the list may only shrink (a listed file that is clean
must leave it; an unlisted file with a reference fails)."""

from __future__ import annotations

import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "adaptfl"
REFERENCE = re.compile(r"\bissues?\s*#?\s*\d+|\bspec\s*§|\bspec\s+section", re.IGNORECASE)
# package files still to clean (paths under adaptfl/); remove each as it is cleaned
NOT_YET_CLEAN: set[str] = set()


def references(root: Path = PACKAGE) -> dict[str, list[str]]:
    """path under `root` -> its offending lines ("line: text"), for every text file."""
    found: dict[str, list[str]] = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:  # a compiled artefact, not source
            continue
        hits = [f"{n}: {line.strip()}" for n, line in enumerate(text.splitlines(), 1)
                if REFERENCE.search(line)]
        if hits:
            found[path.relative_to(root).as_posix()] = hits
    return found


def test_the_pattern_catches_each_form_and_spares_plain_prose() -> None:
    for cited in ("(issue 21 §3: a run", "see Issue #7", "issues 12 and 13", "(spec §8)", "Spec §4",
                  "spec section 2"):
        assert REFERENCE.search(cited), cited
    for plain in ("the issue is that", "seed 003, Algorithm 1", "docs/robustness.md §2",
                  "tissue 3", "respec §"):
        assert not REFERENCE.search(plain), plain


def test_no_package_file_cites_the_tracker_or_the_spec_but_the_listed_ones() -> None:
    found = references()
    new = {path: lines for path, lines in found.items() if path not in NOT_YET_CLEAN}
    cleaned = sorted(NOT_YET_CLEAN - set(found))
    assert not new, f"cite a paper + equation or a docs page instead: {new}"
    assert not cleaned, f"clean now: take them off NOT_YET_CLEAN: {cleaned}"


def test_a_reference_in_any_package_file_is_found(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "rule.py").write_text('"""A rule (spec §2)."""\n')
    (tmp_path / "app.toml.tmpl").write_text("# see issue 40\n")
    (tmp_path / "clean.py").write_text('"""Adam (Kingma & Ba 2015, Algorithm 1)."""\n')
    (tmp_path / "blob.so").write_bytes(b"\xff\xfe issue 9")
    assert references(tmp_path) == {"app.toml.tmpl": ["1: # see issue 40"],
                                    "sub/rule.py": ["1: \"\"\"A rule (spec §2).\"\"\""]}
