"""An in-process FedACT round against the pure compute of its local steps, in one process.

    python benchmarks/bench_round.py [--device cpu|cuda] [--model vit-tiny|vit-s]
                                     [--clients N] [--steps K] [--batch B] [--rounds R]

The round (server sampling, each client's model build, data on the device, K local steps,
reply, validation, aggregation, central evaluation) is timed by the engine itself (the
`seconds` of rounds after the first, which pays one-time costs). The pure compute is K local
steps of the same model and batch size on preloaded batches, timed in a tight loop, times the
number of clients. Goal: a round ≤ 1.3× the sum of its steps' pure compute. The central
evaluation (the whole test split, every round) is timed apart (`eval-seconds`) and reported
both ways: on a CPU with a few short clients it outweighs the training.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from adaptfl.algorithms.config import RunConfig
from adaptfl.engine.inprocess import run_inprocess
from adaptfl.local_update import LocalUpdate
from adaptfl.workloads import build_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import describe  # noqa: E402

GOAL = 1.3


def pure_step_seconds(model_name: str, batch: int, steps: int, device: str) -> float:
    """Median seconds of one FedACT local step (forward, backward, update) on a batch already
    on the device."""
    torch.manual_seed(0)
    model = build_model(model_name, 10, 1, 28).to(device)
    opt = LocalUpdate(model.named_parameters(), lr=1e-3, rho=0.5, trust="act", tau=0.5,
                      diagnostics_every=10)
    opt.set_global_direction({n: torch.zeros_like(p) for n, p in model.named_parameters()})
    x = torch.randn(batch, 1, 28, 28, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    times = []
    for k in range(steps + 3):
        sync()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()
        sync()
        if k >= 3:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--model", choices=("vit-tiny", "vit-s", "cnn", "mlp"), default="vit-tiny")
    parser.add_argument("--clients", type=int, default=None, help="default: 10 on CUDA, 2 on CPU")
    parser.add_argument("--steps", type=int, default=None, help="K; default: 50 on CUDA, 5 on CPU")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--data-dir", default="", help="Fashion-MNIST (default: the system's)")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here")
    clients = args.clients or (10 if args.device == "cuda" else 2)
    steps = args.steps or (50 if args.device == "cuda" else 5)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = RunConfig.of(algorithm="fedact", model=args.model, num_server_rounds=args.rounds,
                           local_steps=steps, batch_size=args.batch, device=args.device,
                           data_dir=args.data_dir, results_dir=tmp, run_name="bench", partitioning="iid",
                           client_state_dir=str(Path(tmp) / "state"),
                           accept_small_rounds=True)  # a timing: rounds of 2 (the dry run's) are fine
        out = run_inprocess(cfg, clients)
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    later = [r for r in rows if r["round"] >= 2]
    round_s = statistics.median(r["seconds"] for r in later)
    eval_s = statistics.median(r["eval-seconds"] for r in later)
    pure = pure_step_seconds(args.model, args.batch, steps, args.device) * steps * clients
    train_ratio, ratio = (round_s - eval_s) / pure, round_s / pure
    print(describe(args.device))
    print(f"{args.model} on {args.device}: {clients} clients x {steps} steps, batch {args.batch}")
    print(f"round (median of rounds 2..{args.rounds}): {round_s:.2f} s, of which central evaluation "
          f"{eval_s:.2f} s; pure compute of its steps: {pure:.2f} s")
    print(f"ratio without the central evaluation {train_ratio:.2f}x (goal <= {GOAL}x: "
          f"{'met' if train_ratio <= GOAL else 'NOT MET'}); with it {ratio:.2f}x")


if __name__ == "__main__":
    main()
