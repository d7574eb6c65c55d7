"""Start Flower processes with their logs in files, and stop every one of them by PID."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path


def _argv0(proc: subprocess.Popen[bytes]) -> str:
    """The program a process runs, for messages (Popen.args is a list here, typed as any command form)."""
    args = proc.args
    first = args[0] if isinstance(args, list | tuple) else args
    return os.fsdecode(first) if isinstance(first, bytes) else str(first)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listens(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def wait_for_port(port: int, proc: subprocess.Popen[bytes], log_file: Path, limit: float = 60,
                  reaches: Callable[[int], bool] = listens) -> None:
    """Until something listens on 127.0.0.1:port (as `reaches` sees it: in a network namespace,
    adaptfl/deploy/netns.py); raises if the process died first."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{_argv0(proc)} exited with {proc.returncode}: "
                               f"{log_file.read_text()[-2000:]}")
        if reaches(port):
            return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listens on port {port} after {limit} s ({_argv0(proc)})")


def wait_for_line(proc: subprocess.Popen[bytes], log_file: Path, text: str, limit: float = 60) -> None:
    """Until `text` is in the process's log; raises if the process died first."""
    deadline = time.monotonic() + limit
    while text not in log_file.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{_argv0(proc)} never logged {text!r} (exit {proc.poll()}): "
                               f"{log_file.read_text(errors='replace')[-2000:]}")
        time.sleep(0.2)


class ProcessGroup:
    """Processes started here, each in its own session so its children stop with it."""

    def __init__(self, log_dir: Path, env: dict[str, str]) -> None:
        self.log_dir = log_dir
        self.env = env
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.argv: dict[str, list[str]] = {}  # what each runs, without a namespace's nsenter
        log_dir.mkdir(parents=True, exist_ok=True)

    def log_of(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def start(self, name: str, argv: list[str], cwd: Path,
              enter: Callable[[list[str]], list[str]] | None = None,
              pass_fds: tuple[int, ...] = ()) -> subprocess.Popen[bytes]:
        """`enter` wraps argv to run it elsewhere (adaptfl/deploy/netns.py); `pass_fds` stay open in it."""
        if name in self.procs:
            raise ValueError(f"process name {name!r} already used")
        with self.log_of(name).open("wb") as log:
            proc = subprocess.Popen(enter(argv) if enter else argv, cwd=cwd, env=self.env, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True, pass_fds=pass_fds)
        self.procs[name], self.argv[name] = proc, argv
        return proc

    def kill(self, name: str) -> None:
        """SIGKILL the process `name` and its group (its children) now."""
        proc = self.procs[name]
        _signal_group(proc, signal.SIGKILL)
        proc.wait(timeout=10)

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


def process_tree() -> dict[int, list[int]]:
    """parent PID -> its children's PIDs, from /proc (Linux)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    return children


def descendants(pid: int, children: dict[int, list[int]] | None = None) -> list[int]:
    """`pid` and every process below it, each before its children (`children`: a
    `process_tree()`, read now when not given)."""
    children = process_tree() if children is None else children
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        todo.extend(children.get(current, []))
    return out


def rss_kb(pid: int) -> int:
    """Resident memory (KiB) of one process now; 0 for a gone process."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    return next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")), 0)


def rss_mb_of_tree(pid: int, children: dict[int, list[int]]) -> float:
    """Resident memory (MiB) of a process and its descendants now; 0 for a gone process."""
    return sum(rss_kb(p) for p in descendants(pid, children)) / 1024


class PeakMemory:
    """Samples each started process's RSS (with its children) twice a second; `peak_mb` holds
    the peak per process name. Linux (/proc) only; elsewhere it stays empty."""

    def __init__(self, group: ProcessGroup, every: float = 0.5) -> None:
        self.group, self.every = group, every
        self.peak_mb: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(self.every):
            children = process_tree()
            for name, proc in list(self.group.procs.items()):
                if proc.poll() is None:
                    rss = rss_mb_of_tree(proc.pid, children)
                    self.peak_mb[name] = max(self.peak_mb.get(name, 0.0), rss)

    def __enter__(self) -> PeakMemory:
        if Path("/proc/self/status").exists():
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
