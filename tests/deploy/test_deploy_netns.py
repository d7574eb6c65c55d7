"""adaptfl/deploy/netns.py: the loopback kit's SuperLink side in a network namespace of its own (issue 21
§5), checked with a plain listener instead of Flower (the kit itself: test_deploy_loopback.py)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from adaptfl.deploy import netns
from adaptfl.deploy.processes import ProcessGroup, free_port, wait_for_line

LISTEN = ("import socket, time\ns = socket.create_server(('127.0.0.1', {port}))\n"
          "print('listening', flush=True)\ntime.sleep(120)")


def _allowed(mode: str) -> bool:
    flags = netns.MODES[mode]
    return subprocess.run(["unshare", *flags, "true"], capture_output=True, check=False).returncode == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="network namespaces are Linux's")
@pytest.mark.parametrize("mode", sorted(netns.MODES))
def test_a_port_inside_the_namespace_is_out_of_reach_of_host_processes(mode, tmp_path) -> None:
    if not _allowed(mode):
        pytest.skip(f"this OS refuses `unshare {' '.join(netns.MODES[mode])}` (the fallback's case)")
    group = ProcessGroup(tmp_path / "logs", dict(os.environ))
    try:
        ns, warning = netns.start(group, tmp_path, "127.0.0.1:1", mode=mode)
        assert warning == "" and ns.mode == mode
        port = free_port()
        listener = group.start("listener", [sys.executable, "-c", LISTEN.format(port=port)], tmp_path,
                               enter=ns.enter)
        wait_for_line(listener, group.log_of("listener"), "listening")
        assert ns.reaches(port)  # the operator's processes, inside, reach it
        with socket.socket() as s:  # this process, outside, finds nothing listening there
            assert s.connect_ex(("127.0.0.1", port)) != 0
        assert group.argv["listener"][0] == sys.executable  # recorded without nsenter
        assert list(listener.args[:3]) == ["nsenter", "--target", str(ns.holder_pid)]
    finally:
        group.stop_all()


def test_where_the_os_allows_no_namespace_the_kit_says_so_in_one_line(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(netns.shutil, "which", lambda name: None)
    mode, why = netns.choose_mode()
    if sys.platform.startswith("linux"):
        assert (mode, why) == ("", "unshare and nsenter not found (util-linux)")
    group = ProcessGroup(tmp_path / "logs", {})
    ns, warning = netns.start(group, tmp_path, "127.0.0.1:8000")
    assert ns.mode == "" and not group.procs  # nothing started: the host's loopback
    assert ns.enter(["flwr", "ls"]) == ["flwr", "ls"]
    assert warning == (f"warning: no network namespace ({why}): the SuperLink's port 127.0.0.1:8000 "
                       "is reachable by every local process on this host (fallback, docs/deployment.md)")
    assert "\n" not in warning


def test_a_refused_unshare_is_named_in_the_fallback_line(monkeypatch) -> None:
    if not sys.platform.startswith("linux"):
        pytest.skip("the platform check answers first elsewhere")
    monkeypatch.setattr(netns.shutil, "which", lambda name: f"/usr/bin/{name}")
    refused = subprocess.CompletedProcess([], 1, "", "unshare: unshare failed: Operation not permitted\n")
    monkeypatch.setattr(netns.subprocess, "run", lambda *a, **k: refused)
    mode, why = netns.choose_mode()
    assert mode == ""
    assert why == ("unshare --net: unshare: unshare failed: Operation not permitted; unshare --user "
                   "--map-root-user --net: unshare: unshare failed: Operation not permitted")
