"""Start Flower processes with their logs in files, and stop every one of them by PID."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen[bytes], log_file: Path, limit: float = 60) -> None:
    """Until something listens on 127.0.0.1:port; raises if the process died first."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}: "
                               f"{log_file.read_text()[-2000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listens on port {port} after {limit} s ({proc.args[0]})")


class ProcessGroup:
    """Processes started here, each in its own session so its children stop with it."""

    def __init__(self, log_dir: Path, env: dict[str, str]) -> None:
        self.log_dir = log_dir
        self.env = env
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        log_dir.mkdir(parents=True, exist_ok=True)

    def log_of(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def start(self, name: str, argv: list[str], cwd: Path) -> subprocess.Popen[bytes]:
        if name in self.procs:
            raise ValueError(f"process name {name!r} already used")
        with self.log_of(name).open("wb") as log:
            proc = subprocess.Popen(argv, cwd=cwd, env=self.env, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        self.procs[name] = proc
        return proc

    def stop_all(self, grace: float = 10.0) -> None:
        """SIGTERM each started process's group (its PID), newest first, then SIGKILL."""
        for proc in reversed(list(self.procs.values())):
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for proc in self.procs.values():
            _signal_group(proc, signal.SIGKILL)  # also children left behind by a stopped leader
            if proc.poll() is None:
                proc.wait(timeout=10)


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    try:
        os.killpg(proc.pid, sig)  # the group id is the PID we started (start_new_session)
    except (ProcessLookupError, PermissionError):
        pass
