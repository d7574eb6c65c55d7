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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import FASHION_MNIST_DIR, needs_fashion_mnist
from tests.support.flower_processes import PROJECT, _pids_with

SCRIPT = PROJECT / "scripts" / "main_job.sh"
TINY = "model='mlp' local-steps=2 batch-size=32 num-threads=1"

pytestmark = [
    pytest.mark.flower,
    pytest.mark.skipif(shutil.which("flwr") is None, reason="the flwr CLI is not installed"),
    pytest.mark.xdist_group("main-jobs"),  # the module's four Flower jobs start once, on one worker
]


def start_main_job(tmp_path: Path, run_config: str, *extra: str,
                   homes: str = "homes") -> subprocess.Popen[str]:
    env = dict(os.environ, ADAPTFL_SKIP_SETUP="1", ADAPTFL_FLOWER_HOMES=str(tmp_path / homes))
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


DIVERGING = (TINY.replace("local-steps=2", "local-steps=50")  # Flower refuses a key given twice
             + " algorithm='fedavg' lr=10 num-server-rounds=1 max-skipped-rounds=1")


@dataclass
class StoppedJob:
    """What the Ctrl-C'd job showed: its port, the processes it ran, what was left after."""
    port: str
    returncode: int | None
    simulation: list[int]
    ray: list[int]
    alive_after: list[int]
    on_port_after: list[int]
    early_end: str


@dataclass
class FlowerJobs:
    """Four main jobs that ran at the same time (each starts its own SuperLink and Ray, which is
    most of a job's time, so one test's start-up is spent once for the module): two that finish
    (`pair`, by rounds), one that diverges, one stopped with Ctrl-C after its round 1."""
    tmp: Path
    pair: dict[int, subprocess.CompletedProcess[str]]
    failing: subprocess.CompletedProcess[str]
    stopped: StoppedJob
    decoys_alive: bool


def _drain(job: subprocess.Popen[str], timeout: float) -> Callable[[], subprocess.CompletedProcess[str]]:
    """Read the job's pipes in a thread (a full pipe would stall it); the returned call waits."""
    box: list[tuple[str, str]] = []
    reader = threading.Thread(target=lambda: box.append(job.communicate(timeout=timeout)), daemon=True)
    reader.start()

    def finished() -> subprocess.CompletedProcess[str]:
        reader.join(timeout)
        assert box, f"{job.args!r} did not finish in {timeout} s"
        return subprocess.CompletedProcess(job.args, job.returncode, *box[0])
    return finished


def _ctrl_c_after_round_1(job: subprocess.Popen[str]) -> StoppedJob:
    port, run_dir = "", None
    for line in job.stdout:  # type: ignore[union-attr]
        if found := re.search(r"private Flower SuperLink on 127\.0\.0\.1:(\d+)", line):
            port = found.group(1)
        if found := re.search(r"results will go to (.+)$", line):
            run_dir = Path(found.group(1))
            break
    assert port and run_dir, "the script did not say which port and results folder it uses"
    threading.Thread(target=job.stdout.read, daemon=True).start()  # type: ignore[union-attr]
    deadline = time.monotonic() + 600  # a generous bound: three other jobs start beside it
    while not (run_dir / "metrics.jsonl").exists() and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.25)  # until round 1 is done: the simulation and Ray are at work
    early = "" if job.poll() is None else "the run ended early: " + job.stderr.read()[-2000:]  # type: ignore[union-attr]
    simulation = _pids_with(f"flwr-simulation --runtime-api-address 127.0.0.1:{port}")
    ray = [pid for sim in simulation for pid in _pids_with(f"_{sim}/")]  # Ray's session dir
    code = None
    if not early:
        os.killpg(job.pid, signal.SIGINT)  # Ctrl-C: the SuperLink gets it too, and stops first
        code = job.wait(timeout=60)
    time.sleep(1)
    alive = [pid for pid in [*simulation, *ray] if Path(f"/proc/{pid}").exists()]
    return StoppedJob(port, code, simulation, ray, alive, _pids_with(f"127.0.0.1:{port}"), early)


@pytest.fixture(scope="module")
def flower_jobs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FlowerJobs]:
    if not os.path.isdir(FASHION_MNIST_DIR):
        pytest.skip(f"Fashion-MNIST not installed at {FASHION_MNIST_DIR}")
    tmp = tmp_path_factory.mktemp("main-jobs")
    # Look-alikes of what the old script's `pkill -f` matched: they must survive.
    decoys = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(900)", marker])
              for marker in (str(PROJECT / ".flwr" / "local-superlink" / "superlink.log"),
                             str(tmp / "homes" / "local-superlink"))]
    previous = tmp / "failing-results" / "fedact-previous"  # a finished run that must not be reported
    previous.mkdir(parents=True)
    (previous / "metrics.jsonl").write_text("{}\n")
    created: list[Path] = []
    jobs: list[subprocess.Popen[str]] = []
    try:
        # One with the script's default results folder (the checkout's results/), one elsewhere.
        where = {2: "", 3: f" results-dir='{tmp / 'results'}'"}
        pair = {rounds: start_main_job(tmp, f"{TINY} num-server-rounds={rounds} seed={rounds}{where[rounds]}")
                for rounds in (2, 3)}
        failing = start_main_job(tmp, f"{DIVERGING} results-dir='{previous.parent}'", homes="failing-homes")
        stopped = start_main_job(tmp, f"{TINY} num-server-rounds=500 results-dir='{tmp / 'stopped'}'",
                                 homes="stopped-homes")
        jobs = [*pair.values(), failing, stopped]
        waits = {rounds: _drain(job, 600) for rounds, job in pair.items()}
        wait_failing = _drain(failing, 600)
        stop = _ctrl_c_after_round_1(stopped)
        finished = {rounds: wait() for rounds, wait in waits.items()}
        for done in finished.values():
            created += results_lines(done.stdout)
        yield FlowerJobs(tmp, finished, wait_failing(), stop, all(d.poll() is None for d in decoys))
    finally:
        for job in jobs:
            if job.poll() is None:  # SIGTERM: the script stops what it started
                job.terminate()
                job.wait(timeout=60)
        for decoy in decoys:
            decoy.kill()
            decoy.wait()
        for run_dir in created:
            if run_dir.parent == PROJECT / "results":
                shutil.rmtree(run_dir)


def results_lines(stdout: str) -> list[Path]:
    return [Path(p) for p in
            re.findall(r"^main_job: done in \d+ s: Flower run \d+ completed; results: (.+)$", stdout, re.M)]


def test_a_failing_run_exits_non_zero_and_names_the_failure(flower_jobs: FlowerJobs) -> None:
    # Passes the preflight (a valid setting: lr at its sane bound), but plain SGD at lr=10 over
    # 50 steps diverges: every reply is non-finite, the round is skipped and the run aborts
    # inside Flower. (A setting the preflight can see, e.g. natural-id on too few nodes, is
    # refused there now, with exit 2: test_preflight.py.)
    done = flower_jobs.failing
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    failure = done.stderr.strip().splitlines()[-1]
    assert re.match(r"main_job: FAILED: Flower run \d+ failed: .*non-finite", failure), failure
    assert "previous" not in done.stdout + done.stderr
    assert "main_job: done" not in done.stdout


def test_two_concurrent_main_jobs_finish_with_their_own_results_and_kill_nothing_else(
        flower_jobs: FlowerJobs) -> None:
    for rounds, done in flower_jobs.pair.items():
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        run_dir = results_line(done.stdout)
        expected_parent = PROJECT / "results" if rounds == 2 else flower_jobs.tmp / "results"
        assert run_dir.parent == expected_parent and run_dir.name.startswith("fedact-"), run_dir
        config = json.loads((run_dir / "config.json").read_text())
        assert (config["num-server-rounds"], config["seed"]) == (rounds, rounds)
        rows = (run_dir / "metrics.jsonl").read_text().splitlines()
        assert len(rows) == rounds + 1, rows  # round 0 is the initial model
    assert len({results_line(done.stdout) for done in flower_jobs.pair.values()}) == 2

    # Each job stopped its own SuperLink: nothing runs from its private Flower home any more
    # (nor from the two other jobs' homes, one of them stopped by Ctrl-C beside these).
    homes = list((flower_jobs.tmp / "homes").iterdir())
    assert len(homes) == 2
    every_home = [*homes, *(flower_jobs.tmp / "failing-homes").iterdir(),
                  *(flower_jobs.tmp / "stopped-homes").iterdir()]
    assert not [pid for home in every_home for pid in _pids_with(str(home))]
    assert flower_jobs.decoys_alive


def test_ctrl_c_leaves_no_flower_or_ray_process_behind(flower_jobs: FlowerJobs) -> None:
    stopped = flower_jobs.stopped
    assert not stopped.early_end, stopped.early_end
    assert stopped.simulation and stopped.ray, "no simulation with Ray running"
    assert stopped.returncode == 130
    assert not stopped.alive_after, f"left running: {stopped.alive_after}"
    assert not stopped.on_port_after
