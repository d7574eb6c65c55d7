"""A private multi-node Ray cluster on this machine: each node started by `ray start` with its own
--temp-dir and free ports (never attaching to, or stopping, another cluster here), stopped by
its process group (never `ray stop`, which stops every Ray on the machine)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from tests.support.flower_processes import free_port

# Ports a node opens; the defaults (10001, 8265, 52365, …) would collide with another cluster.
NODE_PORTS = ("--node-manager-port", "--object-manager-port", "--dashboard-agent-listen-port",
              "--dashboard-agent-grpc-port", "--metrics-export-port", "--runtime-env-agent-port")
HEAD_PORTS = ("--ray-client-server-port", "--dashboard-port")


class RayCluster:
    """`with RayCluster(nodes=2) as cluster:` ... `cluster.address` (for RAY_ADDRESS)."""

    def __init__(self, nodes: int = 2, cpus_per_node: int = 1) -> None:
        self.nodes, self.cpus = nodes, cpus_per_node
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        # Short: Ray's socket paths under it must stay below the OS limit of ~107 bytes.
        self.root = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
        self.groups: list[int] = []  # one process group per node: what `ray start` left running

    def env(self) -> dict[str, str]:
        return {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}

    def _start(self, index: int, head: bool) -> None:
        argv = ["ray", "start", "--node-ip-address=127.0.0.1", f"--temp-dir={self.root / str(index)}",
                f"--num-cpus={self.cpus}", "--disable-usage-stats"]
        argv += ["--head", f"--port={self.port}", "--include-dashboard=false"] if head \
            else [f"--address={self.address}"]
        argv += [f"{flag}={free_port()}" for flag in NODE_PORTS + (HEAD_PORTS if head else ())]
        # Its own session: the daemons `ray start` leaves behind keep this process group.
        proc = subprocess.Popen(argv, env=self.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True, text=True)
        self.groups.append(proc.pid)
        out, _ = proc.communicate(timeout=180)
        if proc.returncode != 0:
            raise RuntimeError(f"ray start (node {index}) failed: {out[-2000:]}")

    def __enter__(self) -> RayCluster:
        if shutil.which("ray") is None:
            raise FileNotFoundError("the `ray` CLI is not on PATH (pip install 'flwr[simulation]')")
        try:
            for i in range(self.nodes):
                self._start(i, head=i == 0)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def kill_node(self, index: int) -> None:
        """SIGKILL node `index` (not the head: 0) and everything it runs, as a machine that dies.
        The raylet puts each worker in its own process group (Ray's process-group cleanup), so
        killing the node's group alone leaves its actors serving calls for a while: every
        descendant is killed too, after the whole tree is frozen (SIGSTOP until a new look finds no
        one new), so that no worker forked between the look and the kill survives it."""
        frozen: set[int] = set()
        while new := _descendants(self.groups[index]) - frozen:
            for pid in new:
                try:
                    os.kill(pid, signal.SIGSTOP)
                except (ProcessLookupError, PermissionError):
                    pass
            frozen |= new
        _signal_group(self.groups[index], signal.SIGKILL)
        for pid in frozen:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def stop(self) -> None:
        for group in reversed(self.groups):
            _signal_group(group, signal.SIGTERM)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(_alive(g) for g in self.groups):
            time.sleep(0.2)
        for group in self.groups:
            _signal_group(group, signal.SIGKILL)
        shutil.rmtree(self.root, ignore_errors=True)


def _signal_group(group: int, sig: signal.Signals) -> None:
    try:
        os.killpg(group, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _descendants(group: int) -> set[int]:
    """Every live process in process group `group` or descended from one (read from /proc)."""
    parent: dict[int, int] = {}
    members: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # Fields after the ")" closing the command name: state, ppid, pgrp, ...
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(entry.name)
        parent[pid] = int(fields[1])
        if int(fields[2]) == group:
            members.add(pid)
    found, grew = set(members), True
    while grew:
        children = {pid for pid, ppid in parent.items() if ppid in found} - found
        found |= children
        grew = bool(children)
    return found


def _alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True
