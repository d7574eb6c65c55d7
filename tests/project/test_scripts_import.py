"""The benchmarks', scripts' and examples' imports of adaptfl resolve (read with ast, imported
here): they run outside the suite, so a module that moves would otherwise break them silently
(benchmarks/hostile_table.py kept a moved module's old path once)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted(p for folder in ("benchmarks", "scripts", "examples") for p in (ROOT / folder).rglob("*.py"))


def adaptfl_imports(path: Path) -> list[tuple[str, str]]:
    """(module, name) of every `from adaptfl... import name` in the file, at any depth."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "adaptfl":
            out += [(node.module or "", alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            out += [(alias.name, "") for alias in node.names if alias.name.split(".")[0] == "adaptfl"]
    return out


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_adaptfl_import_resolves(path: Path) -> None:
    missing = []
    for module, name in adaptfl_imports(path):
        try:
            found = importlib.import_module(module)
        except ImportError as err:
            missing.append(f"{module}: {err}")
            continue
        if name and name != "*" and not hasattr(found, name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ImportError:
                missing.append(f"{module}.{name}")
    assert missing == []


def test_the_files_are_found() -> None:
    assert any(p.name == "hostile_table.py" for p in FILES)
