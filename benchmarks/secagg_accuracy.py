"""What SecAgg+'s fixed point costs in accuracy (docs/secagg.md, issue 35 §4): the same run
plain, under SecAgg+ at the default modulus 2^32 and at a coarse 2^20, and with dp='client'
with and without SecAgg+ (continuous Gaussian noise on floats against the distributed discrete
Gaussian on the integers), on the in-process engine (Fashion-MNIST, mlp, iid).

    python benchmarks/secagg_accuracy.py --nodes 10 --rounds 10 --algorithms fedavg fedact

Prints a markdown table: final test accuracy and the largest |Δ weight| from the plain run's
final model. One seed; the dp rows draw OS noise, so they differ run to run.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from pathlib import Path

import torch

from adaptfl.algorithms.config import RunConfig
from adaptfl.engine.inprocess import InProcessGrid
from adaptfl.server_app.loop import run_federated

VARIANTS = {
    "plain": {},
    "secagg+ (m=32)": {"secagg": "secagg+"},
    "secagg+ (m=20)": {"secagg": "secagg+", "secagg_modulus_bits": 20},
    # what dp costs in accuracy, not its ε: the plan's bound (dp-accept-epsilon) is lifted
    "dp=client": {"dp": "client", "dp_accept_epsilon": 1e6},
    "dp=client + secagg+": {"dp": "client", "secagg": "secagg+", "dp_accept_epsilon": 1e6},
}


def final(run_dir: Path) -> tuple[float, dict[str, torch.Tensor]]:
    import json

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return float(rows[-1]["test-accuracy"]), torch.load(run_dir / "model.pt", weights_only=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--algorithms", nargs="+", default=["fedavg", "fedact"])
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    torch.set_num_threads(1)
    print(f"{args.nodes} nodes, {args.rounds} rounds, mlp, Fashion-MNIST iid, 20 local steps of 32\n")
    print("| algorithm | variant | accuracy | max abs weight gap to plain |")
    print("|---|---|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for algorithm in args.algorithms:
            plain_model = None
            for name, extra in VARIANTS.items():
                cfg = RunConfig.of(algorithm=algorithm, model="mlp", num_server_rounds=args.rounds,
                                   local_steps=20, batch_size=32, weighting="uniform", screen_ratio=0,
                                   max_contribution_ratio=0,
                                   results_dir=tmp, run_name=f"{algorithm}-{len(extra)}-{hash(name)}",
                                   num_threads=1, **extra)
                accuracy, model = final(run_federated(InProcessGrid(args.nodes, cfg.to_flower()), cfg))
                plain_model = plain_model or model
                gap = max(float((model[k] - plain_model[k]).abs().max()) for k in model)
                print(f"| {algorithm} | {name} | {accuracy:.4f} | {gap:.2e} |", flush=True)


if __name__ == "__main__":
    main()
