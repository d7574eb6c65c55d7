"""Many SuperNodes on the loopback deployment: adaptfl against Flower's own FedAvg app on the very
same deployment (TLS, SuperNode authentication, the Fleet API proxy).

    python benchmarks/bench_supernodes.py [--nodes 16] [--rounds 3] [--steps 10] [--model cnn]
                                          [--algorithm fedavg] [--no-bounds]

One deployment (adaptfl/deploy/loopback.py), two `flwr run`s on it: adaptfl (`--algorithm`,
FedAvg by default with plain SGD at a constant lr: like for like; `--no-bounds` turns adaptfl's
reply bounds off, which Flower's FedAvg has not) and
benchmarks/flower_fedavg (FedAvg + `strategy.start`, the same model, data, partitions and central
evaluation). Per round: its time (each app's own `seconds`: from the start of a round, resp. the
end of the previous evaluation, to the end of its evaluation); per SuperNode: the peak RSS of
the SuperNode process and of its SuperExec with the ClientApp processes it starts (one per
message). What a round costs beyond the clients' compute: the time a fresh process needs to
import each app's ClientApp (Flower starts one per message) is printed too.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from adaptfl.deploy.loopback import run_loopback

ROOT = Path(__file__).resolve().parent.parent
BASELINE = ROOT / "benchmarks" / "flower_fedavg"
GOAL = 1.1


def import_seconds(module: str, path: Path) -> float:
    """Median wall time of a fresh interpreter importing `module` (what each message pays)."""
    times = []
    for _ in range(3):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", f"import {module}"], cwd=path, check=True)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def per_node(peaks: dict[str, float], kind: str) -> float:
    values = [mb for name, mb in peaks.items() if name.startswith(kind + "-")]
    return statistics.median(values) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--data-dir", default="", help="Fashion-MNIST (default: the system's)")
    parser.add_argument("--algorithm", default="fedavg", help="adaptfl's side (fedavg: like for like)")
    parser.add_argument("--no-bounds", action="store_true",
                        help="adaptfl's reply bounds off (max-contribution-ratio=0 screen-ratio=0)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-supernodes-") as tmp:
        work = Path(tmp)
        common = f"num-server-rounds={args.rounds} local-steps={args.steps} batch-size=32 " \
                 f"model='{args.model}' data-dir='{args.data_dir}'"
        ours = (f"{common} algorithm='{args.algorithm}' lr=0.1 lr-schedule='constant' num-threads=1 "
                f"diagnostics-every=0 dirichlet-alpha=0.3 results-dir='{work / 'results'}' run-name='ours'"
                + (" max-contribution-ratio=0.0 screen-ratio=0.0" if args.no_bounds else ""))
        theirs = f"{common} lr=0.1 out-dir='{work / 'flower'}'"
        # the SuperLink's state in memory: with its SQLite file, 16 SuperNodes on a loaded machine
        # made writers wait past SQLite's lock timeout and the SuperLink failed the run
        result = run_loopback(work / "deploy", args.nodes, ours, timeout=3600,
                              more_runs=[(BASELINE, theirs)], state_db=False)
        if result.run is None or result.run.returncode != 0 or result.more[0].returncode != 0:
            failed = result.run if result.run is None or result.run.returncode else result.more[0]
            raise SystemExit(f"a run failed: {failed.stdout[-2000:] if failed else ''}")
        read = lambda p: [json.loads(x) for x in p.read_text().splitlines()]  # noqa: E731
        a_rows = [r for r in read(work / "results" / "ours" / "metrics.jsonl") if r["round"] >= 1]
        f_rows = [r for r in read(work / "flower" / "metrics.jsonl") if r["round"] >= 1]
    print(f"{args.nodes} SuperNodes on the loopback deployment (TLS, node auth, Fleet proxy), "
          f"{args.model}, K={args.steps}, every node every round")
    print(f"| round | adaptfl {args.algorithm} s | Flower FedAvg s | ratio |")
    print("|---:|---:|---:|---:|")
    for a, f in zip(a_rows, f_rows, strict=True):
        ratio = a["seconds"] / f["seconds"]
        print(f"| {a['round']} | {a['seconds']:.1f} | {f['seconds']:.1f} | {ratio:.2f} |")
    a_med = statistics.median(r["seconds"] for r in a_rows)
    f_med = statistics.median(r["seconds"] for r in f_rows)
    print(f"| median | {a_med:.1f} | {f_med:.1f} | {a_med / f_med:.2f} |")
    peaks = (result.peak_rss_mb, result.more_peak_rss_mb[0])
    print("\n| per SuperNode (median over nodes, peak RSS MB) | adaptfl | Flower FedAvg |")
    print("|---|---:|---:|")
    print(f"| SuperNode process | {per_node(peaks[0], 'supernode'):.0f} | "
          f"{per_node(peaks[1], 'supernode'):.0f} |")
    print(f"| its SuperExec + ClientApp processes | {per_node(peaks[0], 'superexec-clientapp'):.0f} | "
          f"{per_node(peaks[1], 'superexec-clientapp'):.0f} |")
    print(f"| SuperLink | {peaks[0].get('superlink', 0):.0f} | {peaks[1].get('superlink', 0):.0f} |")
    print(f"| ServerApp's SuperExec (+ ServerApp) | {peaks[0].get('superexec-serverapp', 0):.0f} | "
          f"{peaks[1].get('superexec-serverapp', 0):.0f} |")
    ours_s = import_seconds("adaptfl.client_app.app", ROOT)
    theirs_s = import_seconds("fedavg_baseline.client_app", BASELINE)
    print(f"\nimport of the ClientApp in a fresh process (paid per message): adaptfl {ours_s:.1f} s, "
          f"Flower's FedAvg app {theirs_s:.1f} s")
    waits = [v for r in a_rows for v in r.get("latency", {}).values()]
    if waits:  # send -> reply per message: Flower's polls + the ClientApp process + the training
        print(f"adaptfl per message, send to reply: median {statistics.median(waits):.1f} s, "
              f"max {max(waits):.1f} s over {len(waits)} messages")
    verdict = "met" if a_med / f_med <= GOAL else "NOT MET"
    print(f"median ratio {a_med / f_med:.2f} (goal <= {GOAL}: {verdict})")


if __name__ == "__main__":
    main()
