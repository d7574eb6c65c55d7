"""Run `flwr run` in simulation against a private, managed local SuperLink; stop it by PID."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def flower_env(flwr_home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "FLWR_HOME": str(flwr_home),
        "FLWR_DISABLE_UPDATE_CHECK": "1",
        "FLWR_TELEMETRY_ENABLED": "0",
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        # Private ports, so a SuperLink the user already runs is never reused.
        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(free_port()),
        "FLWR_LOCAL_CONTROL_API_PORT": str(free_port()),
    })
    return env


def _pids_with(marker: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in cmdline:
            pids.append(int(entry.name))
    return pids


def stop_local_superlink(flwr_home: Path) -> None:
    """Stop the managed SuperLink started under `flwr_home`, and its SuperExec children."""
    for pid in _pids_with(str(flwr_home / "local-superlink")):
        children = _pids_with(f"--parent-pid {pid}")
        for target in [pid, *children]:
            try:
                os.kill(target, signal.SIGTERM)
            except ProcessLookupError:
                pass
    time.sleep(1.0)


# The tests' simulations are a few tiny rounds: one Ray actor runs them all. A second one costs its
# start-up (a Ray worker importing torch and adaptfl, ~3.5 s of CPU) for no time saved on the two
# cores the suite shares with its other workers (tests/e2e/test_ray_cluster.py keeps two).
ONE_ACTOR = "client-resources-num-cpus=2"


def flwr_run_simulation(flwr_home: Path, num_supernodes: int, run_config: str,
                        timeout: float = 600) -> subprocess.CompletedProcess[str]:
    flwr = shutil.which("flwr")
    if flwr is None:
        raise FileNotFoundError("the `flwr` CLI is not on PATH")
    federation = f"num-supernodes={num_supernodes} {ONE_ACTOR}"
    return subprocess.run(
        [flwr, "run", str(PROJECT), "--stream", "--federation-config", federation,
         "--run-config", run_config],
        env=flower_env(flwr_home), capture_output=True, text=True, timeout=timeout, check=False)


def flwr_run_app_dir(app: Path, flwr_home: Path, num_supernodes: int, run_config: str | None = None,
                     timeout: float = 600, with_status: bool = False) -> subprocess.CompletedProcess[str]:
    """`flwr run <app> --stream` in simulation for an app folder other than this project (a user's
    own app), with this checkout's adaptfl first on PYTHONPATH; the managed SuperLink that
    `flwr run` starts is stopped by its PID afterwards. `with_status`: through
    `python -m adaptfl.flwr_run` instead, whose exit status is the run's outcome."""
    flwr = shutil.which("flwr")
    if flwr is None:
        raise FileNotFoundError("the `flwr` CLI is not on PATH")
    env = flower_env(flwr_home)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT), env.get("PYTHONPATH", "")) if p)
    federation = f"num-supernodes={num_supernodes} {ONE_ACTOR}"
    runner = [sys.executable, "-m", "adaptfl.flwr_run"] if with_status else [flwr, "run"]
    command = [*runner, str(app), "--stream", "--federation-config", federation]
    if run_config is not None:
        command += ["--run-config", run_config]
    try:
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout,
                              check=False)
    finally:
        stop_local_superlink(flwr_home)
