"""The README gets a newcomer from zero to their own run and links the rest: it stays short, it
holds the two commands and the fast subset, every page under docs/ is linked from it, and every
relative link in the README and docs/ points at a file that exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.flower_processes import PROJECT

README = PROJECT / "README.md"
PAGES = sorted((PROJECT / "docs").glob("*.md"))
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_the_readme_is_short_and_holds_the_commands() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 230, "README.md is over 230 lines: move a section to docs/"
    for command in ("scripts/main_job.sh", "python -m pytest -q -n 3 --dist loadgroup",
                    'python -m pytest -q -n 2 -m "not slow and not flower"'):
        assert command in text, command


def test_every_docs_page_is_linked_from_the_readme() -> None:
    linked = {(README.parent / target).resolve() for target in LINK.findall(README.read_text())}
    assert PAGES, "no docs/*.md pages"
    missing = [page.name for page in PAGES if page.resolve() not in linked]
    assert not missing, f"docs pages the README does not link: {missing}"


@pytest.mark.parametrize("path", [README, *PAGES], ids=lambda p: p.name)
def test_relative_links_resolve(path: Path) -> None:
    targets = [t for t in LINK.findall(path.read_text()) if "://" not in t]
    broken = [t for t in targets if not (path.parent / t).exists()]
    assert not broken, f"{path.name} links to missing files: {broken}"
