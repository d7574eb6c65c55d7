"""Run the same ServerApp and ClientApp code in one process, without Flower's runtime.

`InProcessGrid` and `run_inprocess` are imported on first use (PEP 562), so that
`python -m adaptfl.engine --help` does not wait for torch and Flower to import.
"""

from __future__ import annotations

from typing import Any

__all__ = ["InProcessGrid", "run_inprocess"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from adaptfl.engine import inprocess

        return getattr(inprocess, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
