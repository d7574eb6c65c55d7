"""scripts/install_cpu_torch.sh (the README's CPU-only install) says what happened and what to do
where PyTorch's CPU index cannot be reached, or answers without the wheels, instead of pip's bare
`No matching distribution found` (or a CUDA dependency of PyPI's torch, e.g. `cuda-bindings`)."""

from __future__ import annotations

import functools
import os
import re
import socket
import subprocess
import threading
import tomllib
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.support.flower_processes import PROJECT

SCRIPT = PROJECT / "scripts" / "install_cpu_torch.sh"


def run(index: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, ADAPTFL_TORCH_CPU_INDEX=index)
    return subprocess.run([str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=300)


def test_the_versions_are_pyprojects_caps() -> None:
    pins = dict(re.findall(r"^TORCH=(\S+) TORCHVISION=(\S+)", SCRIPT.read_text(), re.M))
    deps = tomllib.loads((PROJECT / "pyproject.toml").read_text())["project"]["dependencies"]
    caps = {d.split(">=")[0]: d.split("<=")[1] for d in deps if d.startswith(("torch>", "torchvision>"))}
    assert pins == {caps["torch"]: caps["torchvision"]}, (pins, caps)


def test_an_unreachable_index_is_named_and_nothing_runs() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    index = f"http://127.0.0.1:{port}/whl/cpu"
    done = run(index)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"index {index} cannot be reached from this machine" in done.stderr, done.stderr
    assert 'pip install -e ".[test]"' in done.stderr and "ADAPTFL_TORCH_CPU_INDEX" in done.stderr
    assert "Looking in indexes" not in done.stdout + done.stderr  # pip never ran


@pytest.mark.slow
def test_an_index_without_the_wheels_is_explained(tmp_path: Path) -> None:
    (tmp_path / "whl" / "cpu" / "torch").mkdir(parents=True)  # answers, lists no file
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        index = f"http://127.0.0.1:{server.server_address[1]}/whl/cpu"
        done = run(index, "--dry-run")  # never installs anything, whatever pip finds
    finally:
        server.shutdown()
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"pip could not install the CPU build from {index} (ERROR: " in done.stderr, done.stderr
    assert "does not offer torch" in done.stderr and 'pip install -e ".[test]"' in done.stderr
