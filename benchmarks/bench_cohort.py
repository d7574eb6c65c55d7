"""A round's clients one at a time (the engine), as a cohort (`--cohort`), and as bare PyTorch,
side by side in one process, with ratios.

    python benchmarks/bench_cohort.py [--model mlp|cnn] [--clients 10] [--nodes 10]
        [--steps 50] [--batch 50] [--rounds 5] [--algorithm fedavg] [--repeats 2]
        [--device cpu|cuda] [--threads 1] [--forms auto grouped vmap loop] [--pfl]

Each contender trains the same sampled clients for K local steps of batch B on Fashion-MNIST
(Dirichlet α = 0.3 partitions of `--nodes`):
  engine        python -m adaptfl.engine, one client after another (each through its
                ClientApp's handler: message decode, session, K steps, reply)
  cohort        the same with --cohort C = all sampled clients (engine/cohort.py), the form
                it picks; cohort-<form> with --cohort-form forced (--forms)
  bare-loop     a plain loop over the clients: load the global weights, torch.optim.SGD
                (fedavg) / AdamW (other algorithms), K steps on preloaded batches, average
  bare-vmap     the same clients' steps under torch.func.vmap (fedavg: SGD only; left out where a
                partition is smaller than a batch: the batches would not stack)
  pfl           (--pfl, where PyPI's `pfl` is installed: not an adaptfl dependency) Apple's
                pfl-research 0.6, FedAvg with local SGD, in one process
A round's time is the median over rounds 2..R of the engine's `seconds` less its `eval-seconds`
(the central evaluation is the same code for both engines and none of the bare ones'); the
contenders run in turn `--repeats` times and the medians are printed with the machine.
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
from torch.func import functional_call, grad, vmap

from adaptfl.algorithms.config import RunConfig
from adaptfl.core.wire import COHORT_FORMS
from adaptfl.engine.cohort import run_cohort
from adaptfl.engine.inprocess import run_inprocess
from adaptfl.workloads import build_model, load_task, partition_indices, sample_batches

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import describe  # noqa: E402


def engine_round(args: argparse.Namespace, cohort: int, form: str = "auto") -> float:
    """Median training seconds of rounds 2..R of an in-process run."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = RunConfig.of(algorithm=args.algorithm, model=args.model, num_server_rounds=args.rounds,
                           local_steps=args.steps, batch_size=args.batch, device=args.device,
                           data_dir=args.data_dir, results_dir=tmp, run_name="bench",
                           client_state_dir=str(Path(tmp) / "s"),
                           fraction_train=args.clients / args.nodes, seed=1)
        out = run_inprocess(cfg, args.nodes) if cohort == 1 else run_cohort(cfg, args.nodes, cohort, form)
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return statistics.median(r["seconds"] - r["eval-seconds"] for r in rows if r["round"] >= 2)


class Bare:
    """The same workload in plain PyTorch: the clients' partitions preloaded, their batches drawn
    as the engine draws them, the global model averaged after each round."""

    def __init__(self, args: argparse.Namespace) -> None:
        task = load_task("fashion-mnist", args.data_dir, args.model)
        self.args, self.device = args, torch.device(args.device)
        labels = task.train.labels
        self.parts = []
        for pid in range(args.clients):
            rows = torch.as_tensor(partition_indices(labels, args.nodes, pid, "dirichlet", 0.3, 1))
            x, y = task.train.batch(rows)
            self.parts.append((x.to(self.device), y.to(self.device)))
        torch.manual_seed(0)
        self.model = build_model(args.model, 10, 1, 28).to(self.device)

    def batches(self, i: int, r: int) -> list[torch.Tensor]:
        gen = torch.Generator().manual_seed(1000 * r + i)
        return [b.to(self.device) for b in
                sample_batches(len(self.parts[i][1]), self.args.batch, self.args.steps, gen)]

    def loop_round(self, r: int) -> float:
        start = time.perf_counter()
        glob = {n: p.detach().clone() for n, p in self.model.named_parameters()}
        total = {n: torch.zeros_like(p) for n, p in glob.items()}
        for i, (x, y) in enumerate(self.parts):
            with torch.no_grad():
                for n, p in self.model.named_parameters():
                    p.copy_(glob[n])
            opt = torch.optim.SGD(self.model.parameters(), lr=0.1) if self.args.algorithm == "fedavg" \
                else torch.optim.AdamW(self.model.parameters(), lr=1e-3)
            for batch in self.batches(i, r):
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(self.model(x[batch]), y[batch]).backward()
                opt.step()
            for n, p in self.model.named_parameters():
                total[n] += p.detach()
        with torch.no_grad():
            for n, p in self.model.named_parameters():
                p.copy_(total[n] / len(self.parts))
        return time.perf_counter() - start

    def vmap_round(self, r: int) -> float:
        start = time.perf_counter()
        c = len(self.parts)
        params = {n: p.detach().expand(c, *p.shape).clone() for n, p in self.model.named_parameters()}

        def loss(p: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return F.cross_entropy(functional_call(self.model, p, (x,)), y)

        grads_of = vmap(grad(loss))
        batches = [self.batches(i, r) for i in range(c)]
        for k in range(self.args.steps):
            x = torch.stack([self.parts[i][0][batches[i][k]] for i in range(c)])
            y = torch.stack([self.parts[i][1][batches[i][k]] for i in range(c)])
            grads = grads_of(params, x, y)
            params = {n: params[n] - 0.1 * grads[n] for n in params}
        with torch.no_grad():
            for n, p in self.model.named_parameters():
                p.copy_(params[n].mean(0))
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("mlp", "cnn"), default="mlp")
    parser.add_argument("--clients", type=int, default=10, help="sampled a round (the cohort)")
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--algorithm", default="fedavg")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--data-dir", default="", help="Fashion-MNIST (default: the system's)")
    parser.add_argument("--forms", nargs="+", default=["auto"], choices=COHORT_FORMS,
                        help="the cohort's gradient forms to time (auto: the one the engine picks)")
    parser.add_argument("--pfl", action="store_true", help="also pfl-research (PyPI pfl)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    bare = Bare(args)
    times: dict[str, list[float]] = {}
    for _ in range(args.repeats):  # in turn, so a change of load hits every contender
        times.setdefault("engine", []).append(engine_round(args, 1))
        for form in args.forms:
            times.setdefault("cohort" if form == "auto" else f"cohort-{form}", []).append(
                engine_round(args, args.clients, form))
        times.setdefault("bare-loop", []).append(statistics.median(
            bare.loop_round(r) for r in range(args.rounds)))
        if args.algorithm == "fedavg" and min(len(y) for _, y in bare.parts) >= args.batch:
            times.setdefault("bare-vmap", []).append(statistics.median(
                bare.vmap_round(r) for r in range(args.rounds)))
        if args.pfl:
            from pfl_round import pfl_round  # benchmarks/pfl_round.py: needs PyPI's pfl

            times.setdefault("pfl", []).append(pfl_round(args, bare.parts, bare.model))
    print(describe(args.device), f"{args.threads} torch thread(s)")
    print(f"{args.algorithm}, {args.model}: {args.clients} of {args.nodes} clients a round, "
          f"{args.steps} steps of batch {args.batch}; seconds a round (median of {args.repeats} "
          "runs, each the median of its rounds), ratio to the engine one at a time")
    engine = statistics.median(times["engine"])
    for name, values in times.items():
        seconds = statistics.median(values)
        print(f"  {name:10s} {seconds:7.3f} s   {engine / seconds:5.2f}x faster than the engine")


if __name__ == "__main__":
    main()
