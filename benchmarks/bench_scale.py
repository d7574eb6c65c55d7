"""adaptfl against Flower's own FedAvg as the number of simulated clients grows.

    python benchmarks/bench_scale.py [--clients 10,100,1000] [--sampled 10] [--rounds 4]
                                     [--repeats 1] [--algorithm fedavg] [--steps 10]

For each size, `flwr run` in simulation (the same Ray engine, `client-resources-num-cpus=1`) of
adaptfl's app and of benchmarks/flower_fedavg (Flower's `FedAvg` + `strategy.start`, the same
model, data, Dirichlet partitions, plain SGD and central evaluation), each sampling `--sampled`
clients a round. Per run: the round time (median of rounds 2.., round 1 pays Ray's start), the
server process's RSS after the last round (Flower's simulation process: the ServerApp and every
simulated node's context), and the disk the run left (results, and adaptfl's durable client
state). Runs alternate between the two apps so that a load change hits both. Goal: adaptfl's
round time <= 1.15x Flower's at every size.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks import probe_report  # noqa: E402
from tests.support.flower_processes import flower_env, stop_local_superlink  # noqa: E402

BASELINE = ROOT / "benchmarks" / "flower_fedavg"
GOAL = 1.1
PROBE = ROOT / "benchmarks" / "flwr_probe"


def du_mb(*paths: Path) -> float:
    total = sum(f.stat().st_size for p in paths if p.exists() for f in p.rglob("*") if f.is_file())
    return total / 2**20


def flwr_run(app: Path, home: Path, clients: int, run_config: str, timeout: float,
             probe: Path | None = None) -> str:
    federation = f"num-supernodes={clients} client-resources-num-cpus=1"
    env = flower_env(home)
    if probe is not None:  # sitecustomize.py of flwr_probe/ in every process the run starts
        probe.mkdir(parents=True, exist_ok=True)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROBE), env.get("PYTHONPATH", "")) if p)
        env["ADAPTFL_PROBE_DIR"] = str(probe)
    try:
        done = subprocess.run(["flwr", "run", str(app), "--stream", "--federation-config", federation,
                               "--run-config", run_config], env=env, capture_output=True,
                              text=True, timeout=timeout, check=False)
    finally:
        stop_local_superlink(home)
    if done.returncode != 0:
        raise RuntimeError(f"flwr run {app.name} failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    return done.stdout + done.stderr  # `flwr run --stream` exits 0 when the run failed, too


def rows_of(path: Path, rounds: int, log: str) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    done = [r for r in rows if r["round"] >= 1]
    if len(done) != rounds:
        raise RuntimeError(f"{path}: {len(done)} rounds of {rounds}; Flower's log ends:\n{log[-3000:]}")
    return done


def run_adaptfl(work: Path, args: argparse.Namespace, clients: int) -> dict:
    results, state = work / "results", work / "state"
    config = (f"algorithm='{args.algorithm}' num-server-rounds={args.rounds} "
              f"fraction-train={args.sampled / clients} local-steps={args.steps} batch-size=32 "
              f"lr=0.1 lr-schedule='constant' num-threads=1 diagnostics-every=0 model='cnn' "
              f"dirichlet-alpha=0.3 results-dir='{results}' run-name='run' "
              f"client-state-dir='{state}' client-state-memory={str(args.state_memory).lower()}"
              + (" max-contribution-ratio=0.0 screen-ratio=0.0" if args.no_bounds else ""))
    log = flwr_run(ROOT, work / "home", clients, config, args.timeout, probe_dir(work, args))
    rows = rows_of(results / "run" / "metrics.jsonl", args.rounds, log)
    return {"rows": rows, "disk-mb": du_mb(results, state), "state-mb": du_mb(state),
            **probed(work, args)}


def run_flower(work: Path, args: argparse.Namespace, clients: int) -> dict:
    out = work / "out"
    config = (f"num-server-rounds={args.rounds} fraction-train={args.sampled / clients} "
              f"local-steps={args.steps} batch-size=32 lr=0.1 model='cnn' out-dir='{out}'")
    log = flwr_run(BASELINE, work / "home", clients, config, args.timeout, probe_dir(work, args))
    return {"rows": rows_of(out / "metrics.jsonl", args.rounds, log), "disk-mb": du_mb(out), "state-mb": 0.0,
            **probed(work, args)}


def probe_dir(work: Path, args: argparse.Namespace) -> Path | None:
    return work / "probe" if args.probe else None


def probed(work: Path, args: argparse.Namespace) -> dict:
    """{"probe": per-message breakdown} of a run made with --probe (probe_report.py), else {}."""
    if not args.probe:
        return {}
    return {"probe": probe_report.breakdown(probe_report.events(work / "probe"), args.sampled)}


def summarise(runs: list[dict]) -> dict:
    later = [r for run in runs for r in run["rows"] if r["round"] >= 2]
    return {"round-s": statistics.median(r["seconds"] for r in later),
            "rss-mb": statistics.median(run["rows"][-1]["server-rss-mb"] for run in runs),
            "disk-mb": statistics.median(run["disk-mb"] for run in runs),
            "state-mb": statistics.median(run["state-mb"] for run in runs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="10,100,1000")
    parser.add_argument("--sampled", type=int, default=10, help="clients per round, at every size")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--steps", type=int, default=10, help="local steps K")
    parser.add_argument("--algorithm", default="fedavg", help="adaptfl's side (fedavg: like for like)")
    parser.add_argument("--state-memory", action=argparse.BooleanOptionalAction, default=False,
                        help="client-state-memory for adaptfl (default false: disk only)")
    parser.add_argument("--no-baseline", action="store_true",
                        help="adaptfl only (e.g. scaffold's durable state at 1,000 clients)")
    parser.add_argument("--flower-first", action="store_true", help="start each size with Flower's app")
    parser.add_argument("--no-bounds", action="store_true",
                        help="adaptfl's reply bounds off (max-contribution-ratio=0 screen-ratio=0): "
                             "Flower's FedAvg has neither, so like for like; default: adaptfl's defaults")
    parser.add_argument("--probe", action="store_true",
                        help="time every message's path from outside both apps (flwr_probe/): the "
                             "round on one clock for both, and where a message's milliseconds go")
    parser.add_argument("--timeout", type=float, default=900)
    args = parser.parse_args()
    if shutil.which("flwr") is None:
        raise SystemExit("the flwr CLI is not on PATH (pip install flwr==1.42.0)")
    sizes = [int(n) for n in args.clients.split(",")]
    if args.rounds < 2 or min(sizes) < args.sampled:
        raise SystemExit(f"--rounds must be >= 2 and every size >= --sampled={args.sampled}")
    runs: dict[tuple[str, int], list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        for repeat in range(args.repeats):
            for clients in sizes:
                order = [("adaptfl", run_adaptfl)] + ([] if args.no_baseline else [("flower", run_flower)])
                for name, fn in order if (repeat + args.flower_first) % 2 == 0 else order[::-1]:
                    work = Path(tmp) / f"{name}-{clients}-{repeat}"
                    started = time.perf_counter()
                    runs.setdefault((name, clients), []).append(fn(work, args, clients))
                    rss = [r["server-rss-mb"] for r in runs[(name, clients)][-1]["rows"]]
                    print(f"  {name} {clients} clients, repeat {repeat + 1}: "
                          f"{time.perf_counter() - started:.0f} s wall; server RSS MB by round {rss}",
                          file=sys.stderr, flush=True)
                    shutil.rmtree(work, ignore_errors=True)
    if args.no_baseline:
        for clients in sizes:
            a = summarise(runs[("adaptfl", clients)])
            print(f"adaptfl {args.algorithm}, {clients} clients, {args.sampled} a round: "
                  f"round {a['round-s']:.2f} s, "
                  f"server RSS {a['rss-mb']:.0f} MB, disk {a['disk-mb']:.1f} MB of which client state "
                  f"{a['state-mb']:.1f} MB (client-state-memory={str(args.state_memory).lower()})")
        return
    print(f"adaptfl {args.algorithm} vs Flower's FedAvg: {args.sampled} clients a round, K={args.steps}, "
          f"cnn on Fashion-MNIST (Dirichlet 0.3), medians of rounds 2..{args.rounds} x "
          f"{args.repeats} repeat(s); adaptfl's reply bounds "
          f"{'off' if args.no_bounds else 'at their defaults'}")
    print("| clients | adaptfl round s | Flower round s | ratio | adaptfl server RSS MB | "
          "Flower server RSS MB | adaptfl disk MB (client state) | Flower disk MB |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    worst = 0.0
    for clients in sizes:
        a, f = summarise(runs[("adaptfl", clients)]), summarise(runs[("flower", clients)])
        ratio = a["round-s"] / f["round-s"]
        worst = max(worst, ratio)
        print(f"| {clients} | {a['round-s']:.2f} | {f['round-s']:.2f} | {ratio:.2f} | {a['rss-mb']:.0f} | "
              f"{f['rss-mb']:.0f} | {a['disk-mb']:.1f} ({a['state-mb']:.1f}) | {f['disk-mb']:.2f} |")
    print(f"worst ratio {worst:.2f} (goal <= {GOAL}: {'met' if worst <= GOAL else 'NOT MET'})")
    if args.probe:
        print_probe(runs, sizes)


def print_probe(runs: dict[tuple[str, int], list[dict]], sizes: list[int]) -> None:
    """The probe's per-message medians, each app, each size, each repeat (probe_report.py)."""
    keys = ("round-s", "clients-s", "server-s", "configure-s", "aggregate-s", "evaluate-s", "other-s",
            "message-ms", "app-ms", "dispatch-ms", "return-ms",
            "context-get-ms", "context-put-ms", "message-kb", "context-kb", "eval-threads")
    print("\nprobe (one clock for both apps; ms a training message, medians of rounds 2..):")
    print("| clients | app | repeat | " + " | ".join(keys) + " |")
    print("|---:|---|---:|" + "---:|" * len(keys))
    for clients in sizes:
        for name in ("adaptfl", "flower"):
            for i, run in enumerate(runs[(name, clients)]):
                cells = " | ".join(f"{run['probe'][k]:.3g}" for k in keys)
                print(f"| {clients} | {name} | {i + 1} | {cells} |")
        a = statistics.median(r["probe"]["round-s"] for r in runs[("adaptfl", clients)])
        f = statistics.median(r["probe"]["round-s"] for r in runs[("flower", clients)])
        print(f"| {clients} | ratio (probe's round) | | {a / f:.2f} |" + " |" * (len(keys) - 1))


if __name__ == "__main__":
    main()
