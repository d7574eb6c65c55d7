"""The test deployments' short heartbeat (tests/support/flower_heartbeat.py) reaches the modules
of Flower that copy the interval, in a process started the way run_loopback starts its own."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.flower_heartbeat import shorten_heartbeat

COPIES = ("flwr.supernode.fleet_http_connection", "flwr.supercore.heartbeat")


def _intervals(env: dict[str, str]) -> list[str]:
    code = ("import importlib; print(*(importlib.import_module(m).HEARTBEAT_DEFAULT_INTERVAL "
            f"for m in {COPIES!r}))")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120, check=True)
    return done.stdout.split()


def test_a_started_process_sends_the_least_interval_flower_accepts(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _intervals(dict(os.environ)) == ["30", "30"]  # Flower 1.42's own
    shorten_heartbeat(monkeypatch)
    assert _intervals(dict(os.environ)) == ["10", "10"]
