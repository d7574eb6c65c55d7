"""Count the steps the native form takes in this process (every `LocalUpdate` calls
`step.native.act_step_` where `step.choose.choose_path` chose the native form)."""

from __future__ import annotations

from typing import Any

import pytest

from adaptfl.local_update.step import native as native_form


def count_native_steps(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A one-element list whose value is the native steps taken since this call."""
    count, real = [0], native_form.act_step_

    def counted(*args: Any, **kwargs: Any) -> None:
        count[0] += 1
        real(*args, **kwargs)
    monkeypatch.setattr(native_form, "act_step_", counted)
    return count
