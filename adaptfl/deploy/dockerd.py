"""A Docker engine for the compose check: the one already running, or our own, stopped by PID;
and what keeps this machine from running one (said in one line, not a failure of the demo)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

# Debian's docker.io client matches its daemon (20.10, API 1.41); a newer client elsewhere on
# PATH may lack the BuildKit support that `docker build` needs without the buildx plugin.
DOCKER = shutil.which("docker", path="/usr/bin") or "docker"
DOCKERD = shutil.which("dockerd") or "/usr/sbin/dockerd"


def why_not_here() -> str | None:
    """Why no Docker engine can run here, before starting one: None where it may."""
    if os.geteuid() != 0:
        return "not root (dockerd and apt-get need root)"
    if not Path(DOCKERD).is_file():
        return "no dockerd binary (Debian's docker.io)"
    unshare = shutil.which("unshare")
    if unshare and subprocess.run([unshare, "--net", "true"], capture_output=True, timeout=30,
                                  check=False).returncode != 0:
        return "no network namespaces here (unshare --net fails): containers cannot have networks"
    return None


def network_problem() -> str | None:
    """Why the engine cannot give containers a bridge network (iptables, bridge module), or None."""
    name = f"adaptfl-probe-{os.getpid()}"
    made = subprocess.run([DOCKER, "network", "create", name], capture_output=True, text=True,
                          timeout=60, check=False)
    if made.returncode != 0:
        return f"the Docker engine cannot create a network: {made.stderr.strip()[-300:]}"
    subprocess.run([DOCKER, "network", "rm", name], capture_output=True, timeout=60, check=False)
    return None


def engine_answers() -> bool:
    done = subprocess.run([DOCKER, "info"], capture_output=True, timeout=30, check=False)
    return done.returncode == 0


class OwnDockerd:
    """Starts dockerd unless one answers; `stop()` ends only the one started here, by its PID."""

    def __init__(self, log_file: Path) -> None:
        self.log_file = log_file
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, limit: float = 60) -> str:
        if engine_answers():
            return "using the Docker engine already running"
        with self.log_file.open("wb") as log:
            self.proc = subprocess.Popen([DOCKERD, "--storage-driver", "overlay2"], stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dockerd exited with {self.proc.returncode}: "
                                   f"{self.log_file.read_text()[-2000:]}")
            if engine_answers():
                return f"started dockerd (PID {self.proc.pid})"
            time.sleep(0.5)
        raise TimeoutError(f"dockerd did not answer within {limit} s; see {self.log_file}")

    def stop(self, grace: float = 30) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.kill(self.proc.pid, signal.SIGTERM)  # dockerd stops its containers, then exits
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
