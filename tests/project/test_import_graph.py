"""No import cycles between adaptfl's subpackages (module-level imports, read with ast), and no
import inside a function to hide one (docs/architecture.md)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

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


@pytest.mark.slow
def test_no_cycles_between_subpackages() -> None:
    assert cycles(subpackage_graph()) == set()


# Where an import may sit inside a function, and why: start-up time of command-line entry points
# (`--help` without torch and Flower), and one heavy optional import. Nothing else: an import moved
# into a function to dodge a cycle fails here.
LAZY = {
    "adaptfl/engine/__init__.py": "PEP 562: `python -m adaptfl.engine --help` without torch",
    "adaptfl/engine/__main__.py": "the CLI's --help and config errors before torch",
    "adaptfl/server_app/check_overrides.py": "the preflight CLI refuses a bad key before torch",
    "adaptfl/new.py": "`python -m adaptfl.new` writes files before importing the catalog",
    "adaptfl/client_app/session.py": "Sophia's default loss: workloads imports every task's loader",
    "adaptfl/local_update/__init__.py": "PEP 562: `step.reference` and the rules load without "
                                        "LocalUpdate and its fast forms",
    "adaptfl/local_update/rules/adam.py": "the rule's own direction is the fused kernel's pass, "
                                          "imported on use: `step.reference` reads the rule alone",
}
LAZY_FOLDERS = ("adaptfl/harness/",)  # report and sweep commands, each importing what it runs


def test_no_import_inside_a_function_except_for_start_up_time() -> None:
    hidden = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE.parent).as_posix()
        if name in LAZY or name.startswith(LAZY_FOLDERS):
            continue
        for fn in ast.walk(ast.parse(path.read_text())):
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                hidden += [f"{name}:{n.lineno}" for n in ast.walk(fn)
                           if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("adaptfl")
                           or isinstance(n, ast.Import) and any(a.name.startswith("adaptfl")
                                                                for a in n.names)]
    assert hidden == []


def test_the_lazy_list_names_files_that_exist() -> None:
    assert all((PACKAGE.parent / name).is_file() for name in LAZY)
