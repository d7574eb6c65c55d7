"""`.ci/run` prints each stage's wall time and, at its end, every stage's (also when one
fails), and its test command prints the 10 slowest tests: CI's budget is watched at every run
(docs/tests.md), never asserted on a shared machine's clock."""

from __future__ import annotations

import re
import subprocess

from tests.support.flower_processes import PROJECT

STAGES = PROJECT / ".ci" / "stages.sh"
CI_RUN = PROJECT / ".ci" / "run"


def _ci(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", f"set -euo pipefail; source {STAGES}; {script}"],
                          capture_output=True, text=True, timeout=60, check=False)


def test_each_stage_prints_its_time_and_the_summary_lists_them_all() -> None:
    done = _ci("stage first true; stage second sleep 1; echo after")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "[ci] stage first: true" in lines
    assert re.search(r"^\[ci\] stage second: done in 0 min 0[1-9] s$", done.stdout, re.M), lines
    summary = lines[lines.index("[ci] stage times:") + 1:]
    assert [line.split()[1] for line in summary[:2]] == ["first", "second"], summary
    assert re.fullmatch(r"\[ci\] total \d+ min \d\d s \(exit 0\)", summary[-1]), summary


def test_a_failing_stage_stops_ci_and_is_named_in_the_summary() -> None:
    done = _ci("stage passes true; stage breaks false; stage never true")
    assert done.returncode == 1
    assert "[ci] stage never" not in done.stdout
    assert re.search(r"^\[ci\]   breaks FAILED \(exit 1\) after 0 min 0\d s$", done.stdout, re.M), done.stdout
    assert done.stdout.rstrip().endswith("(exit 1)")


def test_ci_runs_the_readmes_test_command_as_a_timed_stage_with_the_slowest_tests() -> None:
    text = CI_RUN.read_text()
    assert "source .ci/stages.sh" in text
    assert re.search(r"^stage tests python -m pytest -q -n 3 --dist loadgroup --durations=10$", text, re.M)
    assert "stage compose-check bash deploy/compose-check.sh --if-possible" in text
