"""Rewrite the generated parts of pyproject.toml ([tool.flwr.app.config]) and docs/algorithms.md
(the key table, the algorithm table), docs/workloads.md (tasks, models), docs/metrics.md and
docs/privacy.md's node-key table from the declarations: `python scripts/regenerate_docs.py`
(tests/algorithms/test_config.py and tests/workloads/test_tables.py fail while any is stale)."""

from __future__ import annotations

from pathlib import Path

from adaptfl.algorithms.config import ALGORITHMS_PAGE, algorithm_table, key_table, pyproject_block
from adaptfl.privacy import client as node_keys
from adaptfl.privacy import reply_metrics
from adaptfl.server_app import columns
from adaptfl.workloads import tables

ROOT = Path(__file__).resolve().parent.parent


def replace_between(path: Path, start: str, end: str, new: str) -> None:
    text = path.read_text()
    a, b = text.index(start), text.index(end)
    path.write_text(text[:a] + new + text[b:])


if __name__ == "__main__":
    replace_between(ROOT / "pyproject.toml", "[tool.flwr.app.config]", "[tool.ruff]",
                    pyproject_block() + "\n")
    replace_between(ROOT / ALGORITHMS_PAGE, "| key | read by | default | meaning |",
                    "<!-- end of key table -->", key_table())
    replace_between(ROOT / ALGORITHMS_PAGE, "| `algorithm=` | paper |", "<!-- end of algorithm table -->",
                    algorithm_table())
    replace_between(ROOT / tables.PAGE, tables.TASK_HEADER, tables.END_TASKS, tables.task_table())
    replace_between(ROOT / tables.PAGE, tables.MODEL_HEADER, tables.END_MODELS, tables.model_table())
    replace_between(ROOT / columns.PAGE, columns.HEADER, columns.END, columns.column_table())
    replace_between(ROOT / node_keys.PAGE, node_keys.TABLE_HEADER, node_keys.TABLE_END,
                    node_keys.node_key_table())
    replace_between(ROOT / node_keys.PAGE, reply_metrics.TABLE_HEADER, reply_metrics.TABLE_END,
                    reply_metrics.reply_table())
    print(f"pyproject.toml, {ALGORITHMS_PAGE}, {tables.PAGE}, {columns.PAGE} and {node_keys.PAGE} "
          "regenerated")
