"""Per-step time of our Sophia / Muon / SOAP against their oracles, side by side in one process,
on a ViT; then bytes per round of every FedPAC / FedMIX-P variant (spec §8).

    python benchmarks/bench_second_order.py [--device cpu|cuda] [--model vit-tiny|vit-s]
                                            [--steps 20] [--threads 2]

Goals (ours / oracle): Muon ≤ 1.1×, SOAP ≤ 1.0×, Sophia ≤ 1.1×. Oracles: torch.optim.Muon +
torch.optim.AdamW (same routing), pytorch_optimizer.SOAP, sophia_opt.SophiaG (test extra).
Only the optimizer step is timed (gradients are fixed random tensors), interleaved per step,
CUDA-synchronised on CUDA. Our Muon batches the Newton-Schulz iterations of same-shaped
matrices (a ViT's 48 hidden matrices are 4 batches); torch.optim.Muon runs them one by one.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from adaptfl.core.params import lookup
from adaptfl.local_update import LocalUpdate
from adaptfl.local_update.theta import light_spec, theta_spec
from adaptfl.workloads import build_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import describe  # noqa: E402


def _oracle(name: str, model: torch.nn.Module, muon: set[str]) -> list[torch.optim.Optimizer]:
    named = dict(model.named_parameters())
    if name == "muon":
        return [torch.optim.Muon([p for n, p in named.items() if n in muon], lr=0.02, weight_decay=0.01),
                torch.optim.AdamW([p for n, p in named.items() if n not in muon], lr=3e-4,
                                  betas=(0.9, 0.95), eps=1e-10, weight_decay=0.01)]
    if name == "soap":
        from pytorch_optimizer import SOAP
        return [SOAP(model.parameters(), lr=3e-3, precondition_frequency=10)]
    from sophia_opt import SophiaG
    return [SophiaG(model.parameters(), lr=1e-3, rho=0.04)]


def _time_pair(name: str, steps: int, device: str, model_name: str,
               routing: str | None = None) -> tuple[float, float]:
    torch.manual_seed(0)
    ours_m = build_model(model_name, 10, 1, 28).to(device)
    theirs_m = build_model(model_name, 10, 1, 28).to(device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    extra = {"muon_routing": routing} if name == "muon" and routing else {}
    ours = [LocalUpdate(ours_m.named_parameters(), preconditioner=name, weight_decay=0.01, **extra,
                        lr={"muon": 0.02, "soap": 3e-3, "sophia": 1e-3}[name])]
    muon = set(ours[0].param_groups[0]["param_names"]) if name == "muon" else set()
    theirs = _oracle(name, theirs_m, muon)
    gen = torch.Generator().manual_seed(1)
    times = {"ours": 0.0, "theirs": 0.0}
    for k in range(steps + 2):  # 2 warm-up steps (SOAP's first step only initialises)
        for label, model, opts in (("ours", ours_m, ours), ("theirs", theirs_m, theirs)):
            for p in model.parameters():
                p.grad = (torch.randn(p.shape, generator=gen) * 1e-2).to(device)
            sync()
            start = time.perf_counter()
            for o in opts:
                o.step()
            sync()
            if k >= 2:
                times[label] += time.perf_counter() - start
    return times["ours"] / steps, times["theirs"] / steps


def _bytes_table() -> None:
    model = build_model("cnn", 10, 1, 28)
    shapes = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    x = sum(p.numel() * 4 for p in model.parameters())
    print(f"\nbytes per client per round, FMNIST CNN (model x = {x} B); ratios to x")
    print(f"{'algorithm':24s} {'down':>10s} {'up':>10s} {'(down+up)/2x':>13s}")
    for opt in ("sophia", "muon", "soap"):
        full = theta_spec(lookup("preconditioner", opt)(), shapes)
        theta = sum(torch.Size(s).numel() * 4 for s, _ in full.values())
        light = sum(torch.Size(s).numel() * 4 for s, _ in light_spec(full, 0.1).values())
        for name, down, up in ((f"local-{opt}", x, x), (f"fedpac-{opt}", 2 * x + theta, x + theta),
                               (f"fedpac-{opt} light", 2 * x + theta, x + light),
                               (f"fedmixp-{opt}", x + theta, x + theta),
                               (f"fedmixp-{opt} light", x + theta, x + light)):
            print(f"{name:24s} {down:10d} {up:10d} {(down + up) / (2 * x):13.2f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--model", choices=("vit-tiny", "vit-s", "cnn", "mlp"), default="vit-tiny")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", choices=("sophia", "muon", "soap"), default=None)
    parser.add_argument("--muon-routing", default=None,
                        help="our Muon's muon-routing (default: its preset; all-2d for an mlp)")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here")
    torch.set_num_threads(args.threads)
    goals = {"muon": 1.1, "soap": 1.0, "sophia": 1.1}
    print(describe(args.device))
    print(f"{args.model} on {args.device}")
    print(f"{'optimizer':10s} {'ours ms':>9s} {'oracle ms':>10s} {'ratio':>7s} {'goal':>6s}")
    for name, goal in goals.items():
        if args.only and name != args.only:
            continue
        ours, theirs = _time_pair(name, args.steps, args.device, args.model, args.muon_routing)
        print(f"{name:10s} {1e3 * ours:9.2f} {1e3 * theirs:10.2f} {ours / theirs:7.2f} {goal:6.1f}")
    _bytes_table()


if __name__ == "__main__":
    main()
