"""The local update: one torch optimizer shell (shell.py) over the preconditioner rules
(rules/), the trust rules (modulation.py), the local step's reference and its fast forms
(step/), and Θ on the wire (theta.py).

`LocalUpdate` is imported on first use (PEP 562), so `local_update.step.reference` and the
rules load without the fast forms they are the oracle of."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from adaptfl.local_update.shell import LocalUpdate

__all__ = ["LocalUpdate"]


def __getattr__(name: str) -> Any:
    if name == "LocalUpdate":
        from adaptfl.local_update.shell import LocalUpdate

        return LocalUpdate
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
