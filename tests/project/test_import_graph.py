"""No import cycles between adaptfl's subpackages (module-level imports, read with ast)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "adaptfl"


def subpackage_graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if len(parts) < 3:
            continue
        here = ".".join(parts[:-1])
        for node in ast.parse(path.read_text()).body:
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here.split(".")[: len(here.split(".")) - node.level + 1]
                    names = [".".join(base + ([node.module] if node.module else []))]
                else:
                    names = [node.module or ""]
            for name in names:
                target = name.split(".")
                if len(target) > 1 and target[0] == "adaptfl" and target[1] != parts[1]:
                    edges[parts[1]].add(target[1])
    return edges


def cycles(edges: dict[str, set[str]]) -> set[tuple[str, str]]:
    def reach(start: str) -> set[str]:
        seen: set[str] = set()
        todo = [start]
        while todo:
            for nxt in edges.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    return {(a, b) for a in edges for b in reach(a) if a < b and a in reach(b)}


def test_no_cycles_between_subpackages() -> None:
    assert cycles(subpackage_graph()) == set()
