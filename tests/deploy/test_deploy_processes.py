"""adaptfl/deploy/processes.py's /proc readers, shared by the loopback deployment's peak memory and the
systems figures (harness/systems.py): a process's tree and its resident memory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from adaptfl.deploy.processes import descendants, process_tree, rss_kb, rss_mb_of_tree

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")


def test_a_started_tree_is_found_parents_first_and_its_memory_counted() -> None:
    # a shell that starts a python child and waits: two levels below this process
    child = "import time; print(flush=True); time.sleep(30)"
    shell = subprocess.Popen(["sh", "-c", f"{sys.executable} -c '{child}' & wait"],
                             stdout=subprocess.PIPE)
    try:
        shell.stdout.readline()  # the grandchild runs
        tree = descendants(os.getpid())
        assert tree[0] == os.getpid() and shell.pid in tree
        below = descendants(shell.pid, process_tree())
        assert len(below) == 2 and below[0] == shell.pid  # the shell, then the python child
        assert tree.index(shell.pid) < tree.index(below[1])
        kb = [rss_kb(p) for p in below]
        assert all(k > 0 for k in kb)
        assert rss_mb_of_tree(shell.pid, process_tree()) * 1024 >= sum(kb) * 0.5  # sampled twice
    finally:
        for pid in reversed(descendants(shell.pid)):
            os.kill(pid, 9)
        shell.wait(timeout=10)
    assert rss_kb(shell.pid) == 0 and rss_mb_of_tree(shell.pid, process_tree()) == 0.0
