"""benchmarks/cpu_by_process.py, which docs/tests.md's figures of where the suite's CPU goes come
from: each kind of process is named from its command line, and a command's own CPU is counted
under its kind with its exit status passed on."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from benchmarks.cpu_by_process import label
from tests.support.flower_processes import PROJECT


@pytest.mark.parametrize("cmdline,kind", [
    ("/usr/bin/python3 /x/bin/flwr-clientapp --insecure\0--token\0abc", "flwr-clientapp"),
    ("python /x/ray/_private/workers/default_worker.py --raylet-name=/tmp/ray/raylet", "default_worker.py"),
    ("/x/ray/core/src/ray/raylet/raylet --store_socket_name=/tmp/s", "raylet"),
    ("python -c import sys;exec(eval(sys.stdin.readline()))", "pytest-worker"),
    ("python -m pytest -q -n 3", "pytest-main"),
    ("python -m adaptfl.engine --num-nodes 2", "adaptfl.engine"),
    ("/usr/bin/python3 /usr/local/bin/flwr run . --stream", "/bin/flwr"),
    ("/bin/sleep\x005", "other: sleep 5"),  # NUL between the arguments, as /proc has them
])
def test_each_kind_of_process_is_named_from_its_command_line(cmdline: str, kind: str) -> None:
    assert label(cmdline) == kind


@pytest.mark.slow
def test_a_commands_cpu_is_counted_under_its_kind_and_its_exit_status_passed_on() -> None:
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.5: pass\n" \
           "raise SystemExit(3)"
    done = subprocess.run([sys.executable, str(PROJECT / "benchmarks" / "cpu_by_process.py"), "--",
                           sys.executable, "-m", "adaptfl.burn_nothing_here", "-c", "x"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1  # python -m of a missing module: its status comes back
    done = subprocess.run([sys.executable, str(PROJECT / "benchmarks" / "cpu_by_process.py"), "--",
                           sys.executable, "-c", burn],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 3, done.stderr
    report = json.loads(done.stdout)
    [(kind, (seconds, count))] = [(k, v) for k, v in report["by-kind"].items() if "process_time" in k]
    assert kind.startswith("other: ") and count == 1 and 1.0 <= seconds <= 2.5, report
    assert report["machine"] and report["exit"] == 3
