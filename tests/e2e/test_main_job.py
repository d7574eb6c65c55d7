"""scripts/main_job.sh tells the truth and hurts nothing: real `flwr run` processes, tiny runs."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import needs_fashion_mnist
from tests.support.flower_processes import PROJECT, _pids_with

SCRIPT = PROJECT / "scripts" / "main_job.sh"
TINY = "model='mlp' local-steps=2 batch-size=32 num-threads=1"

pytestmark = [
    pytest.mark.flower,
    pytest.mark.skipif(shutil.which("flwr") is None, reason="the flwr CLI is not installed"),
]


def start_main_job(tmp_path: Path, run_config: str, *extra: str) -> subprocess.Popen[str]:
    env = dict(os.environ, ADAPTFL_SKIP_SETUP="1", ADAPTFL_FLOWER_HOMES=str(tmp_path / "homes"))
    return subprocess.Popen(
        # two SuperNodes: rounds of two, accepted by name
        [str(SCRIPT), "--run-config", f"{run_config} accept-small-rounds=true", "--federation-config",
         "num-supernodes=2", *extra],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # Its own process group with SIGINT as a terminal gives it, so a test can press Ctrl-C.
        start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def run_main_job(tmp_path: Path, run_config: str) -> subprocess.CompletedProcess[str]:
    job = start_main_job(tmp_path, run_config)
    out, err = job.communicate(timeout=300)
    return subprocess.CompletedProcess(job.args, job.returncode, out, err)


def results_line(stdout: str) -> Path:
    found = re.findall(r"^main_job: done in \d+ s: Flower run \d+ completed; results: (.+)$", stdout, re.M)
    assert len(found) == 1, stdout[-3000:]
    return Path(found[0])


def test_a_config_error_is_one_line_before_flower_starts(tmp_path: Path) -> None:
    for bad, named in [("taux=0.3", "'taux' (did you mean 'tau'?)"), ("tau=0", "tau=0.0: must be > 0.0")]:
        done = run_main_job(tmp_path, f"{TINY} {bad}")
        assert done.returncode == 2, done.stdout + done.stderr
        assert done.stderr.splitlines() == [done.stderr.strip()], done.stderr  # exactly one line
        assert done.stderr.startswith("config error: ") and named in done.stderr, done.stderr
        assert "Successfully started run" not in done.stdout
        assert not (tmp_path / "homes").exists()  # no SuperLink was started


def test_missing_data_is_refused_by_the_preflight_before_flower_starts(tmp_path: Path) -> None:
    empty = tmp_path / "no-data"  # valid config, but no Fashion-MNIST here
    empty.mkdir()
    done = run_main_job(tmp_path, f"{TINY} data-dir='{empty}'")
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stderr.splitlines() == [done.stderr.strip()], done.stderr  # exactly one line
    assert done.stderr.startswith("config error: ") and "lacks Fashion-MNIST" in done.stderr, done.stderr
    assert not (tmp_path / "homes").exists()  # no SuperLink, no run folder


@needs_fashion_mnist
def test_a_relative_results_dir_is_refused_by_the_preflight_naming_the_key(tmp_path: Path) -> None:
    # Issue 33 §2: Flower's ServerApp runs in another working directory, so a relative results-dir
    # failed after Flower started (a traceback, exit 1); it is refused in the preflight instead.
    relative = f"relative-results-{os.getpid()}"
    done = run_main_job(tmp_path, f"{TINY} results-dir='{relative}'")
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stderr.splitlines() == [done.stderr.strip()], done.stderr  # exactly one line
    assert done.stderr.startswith("config error: results-dir=") and "absolute" in done.stderr, done.stderr
    assert "Successfully started run" not in done.stdout and "results:" not in done.stdout
    assert not (tmp_path / "homes").exists() and not (PROJECT / relative).exists()  # nothing written


def test_a_failing_run_exits_non_zero_and_names_the_failure(tmp_path: Path) -> None:
    results = tmp_path / "results"
    previous = results / "fedact-previous"  # a finished earlier run that must not be reported
    previous.mkdir(parents=True)
    (previous / "metrics.jsonl").write_text("{}\n")
    # Passes the preflight (a valid setting: lr at its sane bound), but plain SGD at lr=10 over
    # 50 steps diverges: every reply is non-finite, the round is skipped and the run aborts
    # inside Flower. (A setting the preflight can see, e.g. natural-id on too few nodes, is
    # refused there now, with exit 2: test_preflight.py.)
    diverging = TINY.replace("local-steps=2", "local-steps=50")  # Flower refuses a key given twice
    done = run_main_job(tmp_path, f"{diverging} algorithm='fedavg' lr=10 num-server-rounds=1 "
                                  f"max-skipped-rounds=1 results-dir='{results}'")

    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    failure = done.stderr.strip().splitlines()[-1]
    assert re.match(r"main_job: FAILED: Flower run \d+ failed: .*non-finite", failure), failure
    assert "previous" not in done.stdout + done.stderr
    assert "main_job: done" not in done.stdout


@needs_fashion_mnist
def test_two_concurrent_main_jobs_finish_with_their_own_results_and_kill_nothing_else(
        tmp_path: Path) -> None:
    # Look-alikes of what the old script's `pkill -f` matched: they must survive.
    decoys = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", marker])
              for marker in (str(PROJECT / ".flwr" / "local-superlink" / "superlink.log"),
                             str(tmp_path / "homes" / "local-superlink"))]
    created: list[Path] = []
    try:
        # One with the script's default results folder (the checkout's results/), one elsewhere.
        where = {2: "", 3: f" results-dir='{tmp_path / 'results'}'"}
        jobs = {rounds: start_main_job(tmp_path, f"{TINY} num-server-rounds={rounds} seed={rounds}"
                                                 + where[rounds])
                for rounds in (2, 3)}
        outputs = {rounds: job.communicate(timeout=400) for rounds, job in jobs.items()}
        for rounds, (out, err) in outputs.items():
            assert jobs[rounds].returncode == 0, out[-3000:] + err[-3000:]
            run_dir = results_line(out)
            created.append(run_dir)
            expected_parent = PROJECT / "results" if rounds == 2 else tmp_path / "results"
            assert run_dir.parent == expected_parent and run_dir.name.startswith("fedact-"), run_dir
            config = json.loads((run_dir / "config.json").read_text())
            assert (config["num-server-rounds"], config["seed"]) == (rounds, rounds)
            rows = (run_dir / "metrics.jsonl").read_text().splitlines()
            assert len(rows) == rounds + 1, rows  # round 0 is the initial model
        assert len({results_line(out) for out, _ in outputs.values()}) == 2

        # Each job stopped its own SuperLink: nothing runs from its private Flower home any more.
        homes = list((tmp_path / "homes").iterdir())
        assert len(homes) == 2
        assert not [pid for home in homes for pid in _pids_with(str(home))]
        assert all(decoy.poll() is None for decoy in decoys)
    finally:
        for decoy in decoys:
            decoy.kill()
            decoy.wait()
        for run_dir in created:
            if run_dir.parent == PROJECT / "results":
                shutil.rmtree(run_dir)


@needs_fashion_mnist
def test_ctrl_c_leaves_no_flower_or_ray_process_behind(tmp_path: Path) -> None:
    job = start_main_job(tmp_path, f"{TINY} num-server-rounds=500 results-dir='{tmp_path / 'results'}'")
    try:
        port, run_dir = "", None
        for line in job.stdout:  # type: ignore[union-attr]
            if found := re.search(r"private Flower SuperLink on 127\.0\.0\.1:(\d+)", line):
                port = found.group(1)
            if found := re.search(r"results will go to (.+)$", line):
                run_dir = Path(found.group(1))
                break
        assert port and run_dir, "the script did not say which port and results folder it uses"
        threading.Thread(target=job.stdout.read, daemon=True).start()  # type: ignore[union-attr]
        for _ in range(720):  # until round 1 is done: the simulation and Ray are at work
            if (run_dir / "metrics.jsonl").exists() or job.poll() is not None:
                break
            time.sleep(0.25)
        assert job.poll() is None, "the run ended early: " + job.stderr.read()[-2000:]  # type: ignore[union-attr]
        simulation = _pids_with(f"flwr-simulation --runtime-api-address 127.0.0.1:{port}")
        ray = [pid for sim in simulation for pid in _pids_with(f"_{sim}/")]  # Ray's session dir
        assert simulation and ray, "no simulation with Ray running"
        os.killpg(job.pid, signal.SIGINT)  # Ctrl-C: the SuperLink gets it too, and stops first
        assert job.wait(timeout=60) == 130
    finally:
        if job.poll() is None:  # let the script stop what it started
            job.terminate()
            job.wait(timeout=60)
    time.sleep(1)
    alive = [pid for pid in [*simulation, *ray] if Path(f"/proc/{pid}").exists()]
    assert not alive, f"left running: {alive}"
    assert not _pids_with(f"127.0.0.1:{port}")
