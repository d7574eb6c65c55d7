"""docs/workloads.md's tables of the built-in tasks and models, from their declarations
(tasks.TASKS, models.MODEL_BUILDERS and their docstrings, models.LANGUAGE_MODELS);
`python scripts/regenerate_docs.py` rewrites them, tests/workloads/test_tables.py fails while stale."""

from __future__ import annotations

from .models import LANGUAGE_MODELS, MODEL_BUILDERS
from .tasks import TASKS

PAGE = "docs/workloads.md"
TASK_HEADER = "| `task=` | input | outputs | data |"
MODEL_HEADER = "| `model=` | parameters (Fashion-MNIST / CIFAR-10) | what it is |"
END_TASKS, END_MODELS = "<!-- end of task table -->", "<!-- end of model table -->"


def task_table() -> str:
    rows = [TASK_HEADER, "|---|---|---|---|"]
    rows += [f"| `{name}` | {shape} | {outputs} | {data} |" for name, (shape, outputs, data) in TASKS.items()]
    return "\n".join(rows) + "\n"


def _parameters(name: str, channels: int, size: int, classes: int) -> int:
    import torch

    with torch.random.fork_rng():
        model = MODEL_BUILDERS[name](classes, channels, size)
    return sum(p.numel() for p in model.parameters())


def model_table() -> str:
    rows = [MODEL_HEADER, "|---|---|---|"]
    for name, builder in MODEL_BUILDERS.items():
        what = " ".join((builder.__doc__ or "").split("\n\n")[0].split())
        counts = f"{_parameters(name, 1, 28, 10):,} / {_parameters(name, 3, 32, 10):,}"
        rows.append(f"| `{name}` | {counts} | {what} |")
    for name, shape in LANGUAGE_MODELS.items():
        rows.append(f"| `{name}` | (text tasks) | a Llama decoder: " +
                    ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in shape.items()) + " |")
    return "\n".join(rows) + "\n"
