"""`python -m adaptfl.flwr_run [APP] [SUPERLINK] [flwr run options]`: `flwr run --stream` with
an exit status that says how the run ended.

Flower 1.42's `flwr run --stream` exits 0 however the run ends (a refused config, a run whose
every client failed); the run's outcome is the SuperLink's (`flwr ls --run-id N`), as
scripts/main_job.sh asks it. This does the same for any app: it streams Flower's log, takes the
run id from it, waits until the SuperLink says the run finished, and exits with adaptfl's codes
(before Flower starts, the --run-config text is checked as `check_overrides` does: one line
`config error: …` and exit 2; an app with run-config keys of its own, such as Flower's
`advanced-pytorch` with `server-device`, keeps them: only adaptfl's keys it uses are checked)
(core/exit_codes.py): 0 completed, 2 refused before round 1, 3 aborted after it started, 1 any
other failure. The ServerApp's own last line (server_app/app.py, `adaptfl: run completed: …` or
`adaptfl: run FAILED (…): …`) is repeated at the end, after Flower's shutdown lines.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import click

from adaptfl.core.exit_codes import ABORTED_EXIT_CODE, REFUSED_EXIT_CODE
from adaptfl.server_app.check_overrides import merged_config
from adaptfl.strategies.skips import ANSI

STARTED = re.compile(r"Successfully started run (\d+)")
OUTCOME = re.compile(r"adaptfl: run (completed|FAILED \((refused|aborted)?[^)]*\)).*")
RUN_OPTIONS_WITH_VALUE = {"--federation", "--run-config", "-c", "--federation-config", "--format"}
POLL_SECONDS, WAIT_SECONDS = 2.0, 600.0  # how often, and how long, to ask after the stream ends
Status = tuple[str, str]  # ("finished:completed", details)


def run_configs_of(args: Sequence[str]) -> tuple[Path, list[str]]:
    """The APP folder of `flwr run [APP] …` (default .) and its --run-config texts."""
    positional, texts, take = [], [], ""
    for arg in args:
        if take:
            if take in ("--run-config", "-c"):
                texts.append(arg)
            take = ""
        elif arg in RUN_OPTIONS_WITH_VALUE:
            take = arg
        elif not arg.startswith("-"):
            positional.append(arg)
    return Path(positional[0] if positional else "."), texts


def refusal(args: Sequence[str]) -> str | None:
    """What adaptfl refuses in these arguments before Flower parses them (one line), or None:
    the --run-config text (an unquoted string named with its fix, an unknown key, a bad value, a
    missing file), checked against the app's pyproject as the ServerApp will, or for an app with
    keys of its own only adaptfl's keys (server_app/check_overrides.py)."""
    app, texts = run_configs_of(args)
    if not (app / "pyproject.toml").is_file():
        return None  # Flower says so itself
    try:
        merged_config(texts, app)
    except click.ClickException as err:
        return err.message
    except (ValueError, OSError) as err:
        return str(err)
    return None


def superlink_of(args: Sequence[str]) -> list[str]:
    """The SUPERLINK positional of `flwr run [APP] [SUPERLINK]` (a list of 0 or 1), for `flwr ls`."""
    positional, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg in RUN_OPTIONS_WITH_VALUE:
            skip = True
        elif not arg.startswith("-"):
            positional.append(arg)
    return positional[1:2]


def run_status(superlink: list[str], run_id: int, env: dict[str, str]) -> Status | None:
    """The SuperLink's status of the run and its details, or None if it could not be asked."""
    done = subprocess.run(["flwr", "ls", *superlink, "--run-id", str(run_id), "--format", "json"],
                          capture_output=True, text=True, env=env, check=False, timeout=120)
    try:
        run = json.loads(done.stdout)["runs"][0]
    except (ValueError, KeyError, IndexError):
        return None
    return str(run["status"]), " ".join(str(run.get("status-details", "")).split())


def wait_finished(ask: Callable[[], Status | None], limit: float = WAIT_SECONDS) -> Status | None:
    """Ask until the run is `finished:*` (the stream can end a moment before the run does)."""
    deadline = time.monotonic() + limit
    while True:
        status = ask()
        if status is not None and status[0].startswith("finished:"):
            return status
        if time.monotonic() > deadline:
            return status
        time.sleep(POLL_SECONDS)


def exit_code(status: Status | None, outcome: str) -> int:
    """0 for a completed run; else adaptfl's code for what its ServerApp said, or 1."""
    if status is not None and status[0] == "finished:completed" and "FAILED" not in outcome:
        return 0
    kind = OUTCOME.match(outcome)
    if kind and kind.group(2) == "refused":
        return REFUSED_EXIT_CODE
    if kind and kind.group(2) == "aborted":
        return ABORTED_EXIT_CODE
    return 1


def stream(args: Sequence[str], env: dict[str, str]) -> tuple[int, int | None, str]:
    """Run `flwr run … --stream`, echoing its output; (its exit code, the run id, adaptfl's
    last outcome line)."""
    command = ["flwr", "run", *args, *([] if "--stream" in args else ["--stream"])]
    run_id, outcome = None, ""
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=env, bufsize=1) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            started = STARTED.search(line)
            run_id = int(started.group(1)) if started and run_id is None else run_id
            found = OUTCOME.search(ANSI.sub("", line))  # the closing line: no colour codes
            outcome = found.group(0).strip() if found else outcome
    return proc.returncode, run_id, outcome


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if shutil.which("flwr") is None:
        print("adaptfl.flwr_run: the `flwr` command is not on PATH (pip install flwr)", file=sys.stderr)
        return 1
    env = dict(os.environ)
    # the app's dependencies are this environment's (adaptfl is on no package index)
    env.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")
    refused = refusal(args)
    if refused:
        print("config error: " + " ".join(refused.split()), file=sys.stderr)
        return REFUSED_EXIT_CODE
    returned, run_id, outcome = stream(args, env)
    if run_id is None:
        print(f"adaptfl.flwr_run: FAILED: Flower did not start the run (flwr run exited {returned}; "
              "its message is above)", file=sys.stderr)
        return returned or 1
    status = wait_finished(lambda: run_status(superlink_of(args), run_id, env))
    code = exit_code(status, outcome)
    said = status[0] if status else "unknown (the SuperLink could not be asked)"
    details = f" ({status[1]})" if status and status[1] and code else ""
    print(f"adaptfl.flwr_run: Flower run {run_id} {said}{details}; exit {code}"
          + (f"\n{outcome}" if outcome else ""), file=sys.stderr if code else sys.stdout)
    return code


if __name__ == "__main__":
    sys.exit(main())
