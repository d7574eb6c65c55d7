"""docs/workloads.md's task and model tables are the declarations' (workloads/tables.py)."""

from __future__ import annotations

from pathlib import Path

from adaptfl.workloads import KNOWN_MODELS, KNOWN_TASKS, LANGUAGE_MODELS, tables

PAGE = Path(__file__).resolve().parents[2] / tables.PAGE


def test_the_task_table_is_current_and_names_every_task() -> None:
    text = PAGE.read_text()
    assert tables.task_table() in text, "stale: run python scripts/regenerate_docs.py"
    assert all(f"| `{name}` |" in tables.task_table() for name in KNOWN_TASKS)


def test_the_model_table_is_current_with_parameter_counts() -> None:
    table = tables.model_table()
    assert table in PAGE.read_text(), "stale: run python scripts/regenerate_docs.py"
    assert all(f"| `{name}` |" in table for name in (*KNOWN_MODELS, *LANGUAGE_MODELS))
    assert "| `cnn` | 184,586 / 259,914 |" in table  # the main job's CNN (docs/scale.md)
