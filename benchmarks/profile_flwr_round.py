"""Where a round's time goes under `flwr run`: py-spy on Flower's simulation process and on two
Ray actors, adaptfl's app or Flower's FedAvg app (benchmarks/flower_fedavg), the same sizes.

    python benchmarks/profile_flwr_round.py adaptfl|flower [--clients 10] [--sampled 10]
        [--rounds 4] [--steps 2] [--seconds 25] [--top 25]

Once round 1 has ended (Ray's start is behind), `py-spy record` samples `flwr-simulation` (the
ServerApp, Flower's engine and every node's context) and two `ClientAppActor`s at 50 Hz for
`--seconds`, then prints, per process, the functions that held the most samples (inclusive),
with the rounds' own `seconds` so the window can be read against the messages it held.
Needs py-spy (`pip install py-spy`, not a dependency of adaptfl).
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.support.flower_processes import _pids_with, flower_env, stop_local_superlink  # noqa: E402

FRAME = re.compile(r"(.*?) \((.*?):\d+\)$")


def inclusive(raw: Path) -> tuple[int, collections.Counter[str]]:
    """(samples, {function @ file: samples in which it is on the stack}) of py-spy's raw output."""
    total, counts = 0, collections.Counter[str]()
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        total += int(n)
        keys = set()
        for frame in stack.split(";"):
            m = FRAME.match(frame)
            keys.add(f"{m.group(1)} @{m.group(2).split('site-packages/')[-1].split('/apps/')[-1]}"
                     if m else frame)
        for key in keys:
            counts[key] += int(n)
    return total, counts


def app_and_config(name: str, work: Path, args: argparse.Namespace) -> tuple[Path, Path, str]:
    common = (f"num-server-rounds={args.rounds} fraction-train={args.sampled / args.clients} "
              f"local-steps={args.steps} batch-size=32 lr=0.1 model='cnn'")
    if name == "adaptfl":  # FedAvg, plain SGD: like for like (bench_scale.py)
        return ROOT, work / "r" / "run" / "metrics.jsonl", (
            f"{common} algorithm='fedavg' lr-schedule='constant' num-threads=1 diagnostics-every=0 "
            f"dirichlet-alpha=0.3 results-dir='{work / 'r'}' run-name='run' "
            f"client-state-dir='{work / 's'}'"
            + (" max-contribution-ratio=0.0 screen-ratio=0.0" if args.no_bounds else ""))
    return ROOT / "benchmarks" / "flower_fedavg", work / "out" / "metrics.jsonl", (
        f"{common} out-dir='{work / 'out'}'")


def rows_of(metrics: Path) -> list[dict]:
    if not metrics.exists():
        return []
    return [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("app", choices=("adaptfl", "flower"))
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--sampled", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--seconds", type=int, default=25)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--no-bounds", action="store_true",
                        help="adaptfl's reply bounds off: like for like with Flower's FedAvg")
    args = parser.parse_args()
    if shutil.which("py-spy") is None:
        raise SystemExit("py-spy is not on PATH (pip install py-spy)")
    work = Path(tempfile.mkdtemp(prefix=f"profile-{args.app}-"))
    app, metrics, config = app_and_config(args.app, work, args)
    home = work / "home"
    run = subprocess.Popen(["flwr", "run", str(app), "--stream", "--federation-config",
                            f"num-supernodes={args.clients} client-resources-num-cpus=1",
                            "--run-config", config], env=flower_env(home),
                           stdout=(work / "flwr.log").open("w"), stderr=subprocess.STDOUT)
    try:
        while not any(r.get("round", 0) >= 1 for r in rows_of(metrics)) and run.poll() is None:
            time.sleep(0.2)
        targets = {"flwr-simulation": _pids_with("bin/flwr-simulation")[:1]}
        targets.update({f"actor-{i}": [pid] for i, pid in enumerate(_pids_with("ray::ClientAppActor")[:2])})
        spies = {name: subprocess.Popen(["py-spy", "record", "-p", str(pids[0]), "-d", str(args.seconds),
                                         "-r", "50", "-f", "raw", "-o", str(work / f"{name}.txt"),
                                         "--nonblocking"], stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
                 for name, pids in targets.items() if pids}
        for spy in spies.values():
            spy.wait()
        run.wait(timeout=1800)
    finally:
        stop_local_superlink(home)
    seconds = [round(r["seconds"], 2) for r in rows_of(metrics) if r.get("round", 0) >= 1]
    print(f"{args.app}: {args.sampled} of {args.clients} clients, K={args.steps}, round seconds {seconds}; "
          f"sampled {args.seconds} s after round 1 at 50 Hz ({work})")
    for name in spies:
        total, counts = inclusive(work / f"{name}.txt")
        print(f"== {name}: {total} samples")
        for key, n in counts.most_common(args.top):
            print(f"{n:6d} {100 * n / max(total, 1):5.1f}%  {key[:150]}")


if __name__ == "__main__":
    main()
