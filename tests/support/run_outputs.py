"""Reading a finished run's results directory, shared by the end-to-end tests."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import torch

from adaptfl.server_app.checkpoint import STATE_FILE
from adaptfl.strategies.state import ServerState


def metric_rows(run_dir: Path, initial: bool = False) -> list[dict]:
    """The per-round rows of `metrics.jsonl`, in round order; the initial model's round 0 only
    with `initial`."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return rows if initial else [r for r in rows if r["round"] >= 1]


def confidential_rows(run_dir: Path) -> list[dict]:
    """A dp run's whole per-round rows (server-confidential.jsonl), in round order, round 0 left out."""
    rows = [json.loads(line) for line in (run_dir / "server-confidential.jsonl").read_text().splitlines()]
    return [r for r in rows if r["round"] >= 1]


def final_model(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "model.pt", weights_only=True)


def assert_same_model(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    """Bit-for-bit equality of two state dicts, naming the first tensor that differs."""
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def assert_model_within_rounding(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    """Equal up to the dtype's round-off (torch.testing's default tolerances). Where a resumed
    process must match: Intel's MKL rounds a GEMM by its buffers' alignment unless
    MKL_CBWR=COMPATIBLE, so a fresh process may differ in the last bit (bit for bit on AMD EPYC
    and with MKL_CBWR=COMPATIBLE, measured; docs/tests.md)."""
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], msg=name)


def completed_round(run_dir: Path) -> int:
    """The last round the run's checkpoint holds (0 before the first)."""
    try:
        return ServerState.load(run_dir / STATE_FILE).server_round
    except (FileNotFoundError, EOFError, RuntimeError):
        return 0


def kill_when(command: list[str], cwd: Path, ready: Callable[[], bool], what: str,
              limit: float = 240) -> None:
    """Start `command`, SIGKILL it as soon as `ready()` holds (polled); fail if it ends or hangs
    before (`what` names the moment waited for)."""
    proc = subprocess.Popen(command, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + limit
        while not ready():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"server ended or hung before {what}: "
                                     f"{proc.stderr.read().decode()[-2000:] if proc.stderr else ''}")
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        if proc.stderr:
            proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL


def die_before_checkpoint(monkeypatch, server_round: int) -> None:  # noqa: ANN001
    """The engine's loop raises KeyboardInterrupt (a kill) where it would checkpoint
    `server_round`: that round's rows are written, its state is not."""
    from adaptfl.server_app import loop

    save = loop.save_checkpoint

    def dies(run_dir, state):  # noqa: ANN001, ANN202
        if state.server_round == server_round:
            raise KeyboardInterrupt("killed")
        save(run_dir, state)

    monkeypatch.setattr(loop, "save_checkpoint", dies)
