"""A deployed run's return code is its final status on the SuperLink, not `flwr run`'s exit
(which is 0 however the run ended under Flower 1.42's `--stream`): fakes of `flwr ls`."""

from __future__ import annotations

import json
import subprocess

from adaptfl.deploy.run_status import settled

STREAMED = subprocess.CompletedProcess(["flwr", "run"], 0, "🎊 Successfully started run 4711\n", "")


def _ls(*statuses: str):  # noqa: ANN202 - a fake `flwr` that answers `ls` with these, in turn
    asked: list[list[str]] = []

    def flwr(args: list[str]) -> subprocess.CompletedProcess[str]:
        asked.append(args)
        status = statuses[min(len(asked), len(statuses)) - 1]
        runs = {"runs": [{"run-id": "4711", "status": status, "status-details": "No  heartbeat"}]}
        return subprocess.CompletedProcess(args, 0, json.dumps(runs), "")

    return flwr, asked


def test_a_completed_run_keeps_exit_0_after_waiting_for_it() -> None:
    flwr, asked = _ls("running", "running", "finished:completed")
    assert settled(STREAMED, flwr, "local", timeout=30, poll=0.0).returncode == 0
    assert len(asked) == 3 and asked[0] == ["ls", "local", "--run-id", "4711", "--format", "json"]


def test_a_failed_run_behind_exit_0_becomes_exit_1_naming_it() -> None:
    flwr, _ = _ls("finished:failed")
    done = settled(STREAMED, flwr, "local", timeout=30, poll=0.0)
    assert done.returncode == 1 and "Flower run 4711 failed: No heartbeat" in done.stderr


def test_a_run_still_going_at_the_timeout_is_a_failure() -> None:
    flwr, _ = _ls("running")
    done = settled(STREAMED, flwr, "local", timeout=0.0, poll=0.0)
    assert done.returncode == 1 and "Flower run 4711 running" in done.stderr


def test_flwr_run_failing_itself_is_returned_as_is() -> None:
    flwr, asked = _ls("finished:completed")
    refused = subprocess.CompletedProcess(["flwr", "run"], 1, "", "Invalid run configuration")
    assert settled(refused, flwr, "local", timeout=30) is refused and not asked
