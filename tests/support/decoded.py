"""What the clients decoded: every broadcast record a `ClientSession` decodes, copied as it
arrived, for tests that compare it with the server's state."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from adaptfl.client_app import session as client_session

Decoded = dict[str, dict[str, torch.Tensor]]  # record name -> its arrays


def record_decoded(monkeypatch: pytest.MonkeyPatch,
                   add: Callable[[list[Decoded], str, dict[str, torch.Tensor]], None]) -> list[Decoded]:
    """A live list that `add(seen, name, record)` fills with each decoded record's copy."""
    seen: list[Decoded] = []
    original = client_session.ClientSession._decoded

    def recording(self, name, record):  # noqa: ANN001, ANN202
        out = original(self, name, record)
        add(seen, name, {k: v.clone() for k, v in out.items()})
        return out

    monkeypatch.setattr(client_session.ClientSession, "_decoded", recording)
    return seen
