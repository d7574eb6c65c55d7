"""A user's type checker sees adaptfl's types (PEP 561 `py.typed`, plain-path editable install)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_py_typed_marker_is_in_the_package() -> None:
    assert (REPO / "adaptfl" / "py.typed").is_file()


@pytest.mark.slow
def test_mypy_outside_the_repo_resolves_adaptive_strategy(tmp_path: Path) -> None:
    assert REPO not in tmp_path.resolve().parents
    (tmp_path / "user.py").write_text(
        "from adaptfl.strategies.base import AdaptiveStrategy\nreveal_type(AdaptiveStrategy)\n"
    )
    # adaptfl's modules are followed; the big third-party ones are not (torch alone was ~25 s of
    # mypy's 30): what is checked is that adaptfl's own types resolve from outside the checkout
    (tmp_path / "mypy.ini").write_text(
        "[mypy]\nfollow_imports = silent\n\n"
        "[mypy-torch.*,torchvision.*,flwr.*,numpy.*,ray.*,grpc.*,google.*,scipy.*,matplotlib.*]\n"
        "follow_imports = skip\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MYPYPATH")}
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental", "user.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900,
    )
    out = done.stdout + done.stderr
    assert "import-not-found" not in out, out
    assert 'Revealed type is "def' in out and "adaptfl.strategies.base.AdaptiveStrategy" in out, out
