"""Systems figures: `flwr run` simulation vs the in-process engine on one job, bytes per round
per algorithm against the spec's wire table, and the peak memory of a 100-client run.

`python -m adaptfl.harness.systems --out results/sweeps/systems.json` (about 3-5 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from adaptfl import source as where
from adaptfl.algorithms.catalog import catalog
from adaptfl.algorithms.config import RunConfig
from adaptfl.deploy.processes import descendants, free_port, rss_kb

# What each algorithm's paper sends per sampled client and round (docs/algorithms.md's table of
# records down / up), in model-sized arrays
# (down, up), from the second round on (round 1 sends no Δ_G / v̄ / g).
SPEC_WIRE = {
    "fedavg": (1, 1, "x / Δ"), "localadamw": (1, 1, "x / Δ"), "fedadam": (1, 1, "x / Δ"),
    "fedadamom": (1, 1, "x / Δ"), "fedadamw": (3, 2, "x, Δ_G, v̄ / Δ, v"),
    "fedact": (3, 2, "x, Δ_G, v̄ / Δ, v"), "hafedho": (2, 1, "x, g, f̂ / Δ, f̂_i"),
    "scaffold": (2, 2, "x, c / Δ, Δc_i"), "mimelite": (2, 2, "x, m / Δ, ∇f_i(x)"),
    # seed 001 Table 6: FedPAC-SOAP ≈ 3x the model per round in total, the light variant 1.1x.
    "fedpac-soap": (None, None, "x, g_G, Θ / Δ, Θ_i (Table 6: 3x model in total)"),
}
SMALL_JOB = {"model": "mlp", "local-steps": 5, "batch-size": 32, "num-threads": 1}


def _config(**overrides: Any) -> RunConfig:
    return RunConfig.from_flower({**SMALL_JOB, **overrides}, drop_unused=True)


def _seconds(run_dir: Path) -> list[float]:
    with (run_dir / "metrics.csv").open(newline="") as fh:
        return [float(r["seconds"]) for r in csv.DictReader(fh) if int(r["round"]) >= 1]


def _superlinks(flwr_home: Path) -> list[int]:
    marker = str(flwr_home / "local-superlink").encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def flwr_run(num_nodes: int, run_config: dict[str, Any], timeout: float = 900) -> dict[str, Any]:
    """One `flwr run` simulation on a private managed SuperLink; returns wall time and the peak
    memory summed over the SuperLink's process tree (SuperExec, simulation, Ray), sampled every
    0.2 s. Stops the SuperLink it started, by PID."""
    flwr = shutil.which("flwr")
    if flwr is None:
        raise FileNotFoundError("the `flwr` CLI is not on PATH")
    home = Path(tempfile.mkdtemp(prefix="adaptfl-flwr-"))
    env = {**os.environ, "FLWR_HOME": str(home), "FLWR_DISABLE_UPDATE_CHECK": "1",
           "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
           "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(free_port()),
           "FLWR_LOCAL_CONTROL_API_PORT": str(free_port())}
    overrides = " ".join(f"{k}={json.dumps(v)}" for k, v in run_config.items())
    app = where.checkout("the flwr-run systems figure")  # its pyproject.toml is the Flower app
    command = [flwr, "run", str(app), "--stream", "--federation-config",
               f"num-supernodes={num_nodes} client-resources-num-cpus=1", "--run-config", overrides]
    peak, stop = [0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            total = sum(rss_kb(p) * 1024 for link in _superlinks(home) for p in descendants(link))
            peak[0] = max(peak[0], total)
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    started = time.perf_counter()
    sampler.start()
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    finally:
        stop.set()
        sampler.join()
        for pid in _superlinks(home):
            for child in reversed(descendants(pid)):
                try:
                    os.kill(child, signal.SIGTERM)
                except ProcessLookupError:
                    pass
    if done.returncode != 0:
        raise RuntimeError(f"flwr run failed ({done.returncode}): {done.stderr[-2000:]}")
    return {"wall-s": time.perf_counter() - started, "peak-rss-bytes": peak[0]}


def engine_vs_flwr(results: Path, num_nodes: int = 4, rounds: int = 4) -> dict[str, Any]:
    """The same job (FedACT, MLP, 5 local steps) through both; seconds per round from each
    run's own metrics (round 1 includes start-up; the steady state is rounds 2..R)."""
    from adaptfl.engine.inprocess import run_inprocess

    job = {"algorithm": "fedact", "num-server-rounds": rounds, "results-dir": str(results)}
    started = time.perf_counter()
    inproc_dir = run_inprocess(_config(**job, **{"run-name": "inprocess"}), num_nodes)
    inproc_wall = time.perf_counter() - started
    flwr = flwr_run(num_nodes, {**SMALL_JOB, **job, "run-name": "flwr"})
    a, b = _seconds(inproc_dir), _seconds(results / "flwr")
    steady_a, steady_b = sum(a[1:]) / len(a[1:]), sum(b[1:]) / len(b[1:])
    return {"num-nodes": num_nodes, "rounds": rounds, "inprocess-round-s": a, "flwr-round-s": b,
            "inprocess-steady-s": steady_a, "flwr-steady-s": steady_b, "steady-ratio": steady_b / steady_a,
            "inprocess-wall-s": inproc_wall, "flwr-wall-s": flwr["wall-s"],
            "wall-ratio": flwr["wall-s"] / inproc_wall}


def bytes_per_algorithm(results: Path, num_nodes: int = 2) -> list[dict[str, Any]]:
    """Bytes per sampled client in round 3 (the steady state), in units of the model's bytes."""
    from adaptfl.engine.inprocess import run_inprocess
    from adaptfl.workloads import build_task_model, load_task

    model_bytes = sum(t.numel() * t.element_size()
                      for t in build_task_model("mlp", load_task("fashion-mnist", "")).state_dict().values())
    rows = []
    for algorithm in [a for a in SPEC_WIRE if a in catalog()]:
        run_dir = run_inprocess(_config(**{"algorithm": algorithm, "num-server-rounds": 3,
                                           "local-steps": 1, "results-dir": str(results),
                                           "accept-small-rounds": num_nodes < 3,
                                           "run-name": f"bytes-{algorithm}",
                                           "client-state-dir": str(results / "state" / algorithm)}),
                                num_nodes)
        with (run_dir / "metrics.csv").open(newline="") as fh:
            last = list(csv.DictReader(fh))[-1]
        sampled = float(last["replies-sampled"])
        down, up, wire = SPEC_WIRE[algorithm]
        rows.append({"algorithm": algorithm, "spec": wire, "spec-down": down, "spec-up": up,
                     "down": float(last["bytes-down"]) / sampled / model_bytes,
                     "up": float(last["bytes-up"]) / sampled / model_bytes})
    return rows


def peak_memory_inprocess(num_nodes: int = 100) -> dict[str, Any]:
    """Peak RSS of `python -m adaptfl.engine` with `num_nodes` clients (GNU time's maximum RSS)."""
    command = ["/usr/bin/time", "-v", sys.executable, "-m", "adaptfl.engine", "--num-nodes", str(num_nodes),
               "model=mlp", "num-server-rounds=1", "local-steps=2", "num-threads=1",
               f"results-dir={tempfile.mkdtemp(prefix='adaptfl-mem-')}"]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=tempfile.gettempdir(), capture_output=True, text=True, check=True)
    found = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
    if found is None:
        raise RuntimeError(f"no maximum RSS in the output of {command[0]}: {done.stderr[-500:]!r}")
    kb = int(found.group(1))
    return {"num-nodes": num_nodes, "peak-rss-bytes": kb * 1024, "wall-s": time.perf_counter() - started}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--skip-flwr", action="store_true", help="only the in-process figures")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="adaptfl-systems-"))
    figures: dict[str, Any] = {"bytes": bytes_per_algorithm(work),
                               "memory-inprocess": peak_memory_inprocess(100)}
    if not args.skip_flwr:
        figures["speed"] = engine_vs_flwr(work)
        flwr = flwr_run(100, {**SMALL_JOB, "num-server-rounds": 1, "local-steps": 2,
                              "results-dir": str(work), "run-name": "flwr-100"})
        figures["memory-flwr"] = {"num-nodes": 100, **flwr}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2))
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
