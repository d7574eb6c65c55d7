"""What each algorithm keeps in Flower's `context.state` per node, in bytes.

    python benchmarks/bench_context.py [--algorithms fedavg,scaffold,...] [--model cnn]
        [--nodes 8] [--sampled 4] [--rounds 2] [--data-dir DIR]

In Flower's simulation every node's context lives in the server's process (`flwr-simulation`)
and Ray carries it to the actor and back with every message, so what a node keeps there costs
the server memory for each node that ever took part and each message its round trip. Per
algorithm (default: every algorithm of the catalog, each with its own defaults), an in-process
run of `--rounds` rounds, `--sampled` of `--nodes` nodes a round; then the largest node's
context (pickled, as Ray sends it: client_state.context_bytes), its largest key, and the nodes
never sampled (which must keep nothing). Run once with the default `client-state-memory=false`
and once with `true` (durable state also in memory); the model's own float32 bytes for scale.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from adaptfl.algorithms.catalog import catalog
from adaptfl.algorithms.config import RunConfig
from adaptfl.client_app.client_state import context_bytes
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.server_app.loop import run_federated
from adaptfl.workloads import build_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import describe  # noqa: E402


def measure(args: argparse.Namespace, algorithm: str, in_memory: bool) -> tuple[int, str, int]:
    """(largest node's context bytes, its largest key, bytes kept by nodes never sampled)."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = RunConfig.of(algorithm=algorithm, model=args.model, num_server_rounds=args.rounds,
                           local_steps=2, batch_size=16, num_threads=1, diagnostics_every=0,
                           fraction_train=args.sampled / args.nodes, data_dir=args.data_dir,
                           results_dir=tmp, run_name="ctx", client_state_dir=str(Path(tmp) / "s"),
                           client_state_memory=in_memory, seed=1)
        grid = InProcessGrid(args.nodes, cfg.to_flower())
        out = run_federated(grid, cfg)
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        sampled = {int(p) + 1 for r in rows if r["round"] >= 1 for p in r["clients"]}
        sizes = {node: context_bytes(c.state) for node, c in grid.contexts.items()}
    biggest = max(sizes.values(), key=lambda s: sum(s.values()))
    key = max(biggest, key=biggest.__getitem__, default="-")
    idle = sum(sum(s.values()) for node, s in sizes.items() if node not in sampled)
    return sum(biggest.values()), key, idle


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--algorithms", default=",".join(catalog()))
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--sampled", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--data-dir", default="")
    args = parser.parse_args()
    model_bytes = sum(p.numel() * 4 for p in build_model(args.model, 10, 1, 28).parameters())  # Fashion-MNIST
    print(f"# {describe('cpu')}; model {args.model}: {model_bytes / 1e3:.1f} kB of float32")
    print("| algorithm | context kB per node (default) | its largest key | "
          "with client-state-memory=true kB | never-sampled nodes' bytes |")
    print("|---|---:|---|---:|---:|")
    for algorithm in args.algorithms.split(","):
        default, key, idle = measure(args, algorithm, in_memory=False)
        memory, _, idle_memory = measure(args, algorithm, in_memory=True)
        print(f"| {algorithm} | {default / 1e3:.1f} | `{key}` | {memory / 1e3:.1f} | "
              f"{idle + idle_memory} |", flush=True)


if __name__ == "__main__":
    main()
