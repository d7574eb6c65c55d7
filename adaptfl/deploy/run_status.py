"""A deployed run's outcome from the SuperLink, not from `flwr run`'s exit status.

Flower 1.42's `flwr run --stream` exits 0 however the run ended: it returns when the log stream
does, and under load the stream can end before the run (seen: exit 0 with 3 of 4 rounds'
rows). `settled` waits for the run's final status (`flwr ls --run-id N --format json`, as
scripts/main_job.sh does) and gives `flwr run`'s result a return code that says it: 0 only for
`finished:completed`.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable

STARTED = re.compile(r"Successfully started run (\d+)")
Cli = Callable[[list[str]], subprocess.CompletedProcess[str]]  # `flwr ARGS`, as the operator


def run_id_of(run: subprocess.CompletedProcess[str]) -> int | None:
    found = STARTED.search(run.stdout + run.stderr)
    return int(found.group(1)) if found else None


def status_of(ls: subprocess.CompletedProcess[str]) -> tuple[str, str]:
    """(status, details) of the one run `flwr ls --run-id N --format json` printed; ('', why)
    when it printed none."""
    try:
        run = json.loads(ls.stdout)["runs"][0]
    except (ValueError, KeyError, IndexError, TypeError):
        return "", f"flwr ls exited {ls.returncode}: {(ls.stdout + ls.stderr).strip()[-300:]}"
    return str(run.get("status", "")), " ".join(str(run.get("status-details", "")).split())


def settled(run: subprocess.CompletedProcess[str], flwr: Cli, connection: str, timeout: float,
            poll: float = 2.0) -> subprocess.CompletedProcess[str]:
    """`run` once its Flower run has finished: return code 0 if it completed, else 1 with the
    status and its details appended to stderr. A `flwr run` that failed itself is returned as is."""
    run_id = run_id_of(run)
    if run.returncode != 0 or run_id is None:
        return run
    deadline = time.monotonic() + timeout
    while True:  # the wait follows the run: it ends when the SuperLink says the run has
        status, details = status_of(flwr(["ls", connection, "--run-id", str(run_id), "--format", "json"]))
        if status.startswith("finished:") or time.monotonic() > deadline:
            break
        time.sleep(poll)
    if status == "finished:completed":
        return run
    what = status or "no status"
    note = f"\nFlower run {run_id} {what.removeprefix('finished:')}: {details or 'no details'}\n"
    return subprocess.CompletedProcess(run.args, 1, run.stdout, run.stderr + note)
