"""Test deployments that kill SuperNodes run Flower's heartbeat at its least interval (10 s):
the processes they start find short_heartbeat/sitecustomize.py first on PYTHONPATH."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

SITE_DIR = Path(__file__).parent / "short_heartbeat"


def shorten_heartbeat(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every process a test starts after this call takes a dead SuperNode for offline after
    ~20 s instead of 36-60 s (the environment is the test's: run_loopback copies os.environ)."""
    paths = [str(SITE_DIR), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))
