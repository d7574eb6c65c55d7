"""Optional TensorBoard event files (`tensorboard=true`): every numeric metric of every round,
in `<results dir>/tensorboard/`, next to metrics.csv / metrics.jsonl, which stay the source of
truth. Needs the `tensorboard` extra: `pip install "adaptfl[tensorboard]"`."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def open_writer(run_dir: Path) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ValueError("tensorboard=true needs the tensorboard package: "
                         "pip install 'adaptfl[tensorboard]'") from None
    return SummaryWriter(log_dir=str(run_dir / "tensorboard"))


def write_row(writer: Any, row: dict[str, Any]) -> None:
    step = int(row["round"])
    for key, value in row.items():
        if key != "round" and isinstance(value, int | float) and not isinstance(value, bool):
            writer.add_scalar(key, value, step)
    writer.flush()
