"""FedACT's local update vs torch's AdamW on ViT-Tiny parameters, side by side in one process.

    python benchmarks/bench_fedact.py [--threads N] [--repeats R]

A script, not a test. (a) times the optimizer step alone (gradients already set), (b) a full
local step (forward, backward, update) on a batch of 50 Fashion-MNIST-shaped images. Every
variant runs once per repetition, in alternating order (A B C .. / .. C B A), so drift and
bursts of load from other processes on a shared machine fall on all of them alike; we report
medians, the ratio of the medians, and the median of the per-repetition (paired) ratios.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere, uninstalled

import adaptfl.local_update.topk as topk  # noqa: E402
from adaptfl.local_update import LocalUpdate  # noqa: E402
from adaptfl.workloads import build_model  # noqa: E402

GOAL_UPDATE = 2.0  # (a) FedACT update / AdamW update
GOAL_STEP = 1.05  # (b) FedACT local step / AdamW local step
BATCH = 50
WD = 0.01  # torch AdamW's default and FedACT's preset
FEDACT = dict(preconditioner="adamw", lr=1e-3, weight_decay=WD, rho=0.5, trust="act", tau=0.5)


def fedact(model: torch.nn.Module, dg: dict[str, torch.Tensor], diagnostics: bool = False) -> LocalUpdate:
    opt = LocalUpdate(model.named_parameters(), **FEDACT, diagnostics_every=int(diagnostics))
    opt.set_global_direction(dg)
    return opt


def vit_with_dense_grads() -> torch.nn.Module:
    """ViT-Tiny (1x28x28, 10 classes) after two AdamW steps, with a fresh gradient set.

    torchvision zero-initialises the classifier head, so at the very first step every gradient
    outside the head is exactly 0 (5.35M tied trust scores). Two steps make them dense, as
    they are at every later step of a run.
    """
    torch.manual_seed(0)
    model = build_model("vit-tiny", 10, 1, 28)
    x, y = torch.randn(BATCH, 1, 28, 28), torch.randint(0, 10, (BATCH,))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for i in range(3):
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        if i < 2:
            opt.step()
    return model


def delta_g_for(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return {n: 1e-3 * torch.randn(p.shape, generator=gen) for n, p in model.named_parameters()}


def naive_threshold(fn: Callable[[], object]) -> Callable[[], object]:
    """Run `fn` with every exact k-th-largest computed by one torch.kthvalue over all of D."""
    def run() -> object:
        saved, topk._SMALL = topk._SMALL, float("inf")
        try:
            return fn()
        finally:
            topk._SMALL = saved
    return run


def twin_with_grads(model: torch.nn.Module) -> torch.nn.Module:
    twin = copy.deepcopy(model)
    for p, q in zip(model.parameters(), twin.parameters(), strict=True):
        q.grad = p.grad.clone()  # deepcopy drops .grad
    return twin


def optimizers(model: torch.nn.Module) -> dict[str, tuple[torch.nn.Module, torch.optim.Optimizer,
                                                         bool]]:
    """name -> (its own copy of the model, optimizer, naive threshold?)."""
    dg = delta_g_for(model)
    out = {}
    for name, kind in (("AdamW (foreach)", "adamw"), ("FedACT", "act"),
                       ("FedACT + diagnostics", "diag"), ("FedACT, naive kthvalue", "naive")):
        twin = twin_with_grads(model)
        if kind == "adamw":
            opt = torch.optim.AdamW(twin.parameters(), lr=1e-3, weight_decay=WD, foreach=True)
        else:
            opt = fedact(twin, dg, diagnostics=kind == "diag")
        out[name] = (twin, opt, kind == "naive")
    return out


def check_naive_matches(model: torch.nn.Module) -> None:
    """The sampled threshold must select exactly what the naive one does: same parameters."""
    a, b = twin_with_grads(model), twin_with_grads(model)
    dg = delta_g_for(model)
    opt_a, opt_b = fedact(a, dg), fedact(b, dg)
    opt_a.step()
    naive_threshold(opt_b.step)()
    same = all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    moved = not torch.equal(next(a.parameters()), next(model.parameters()))
    if not (same and moved):
        raise SystemExit("FAILED: the sampled and the naive exact threshold disagree")


def interleaved(fns: dict[str, Callable[[], object]], repeats: int, warmup: int
                ) -> dict[str, list[float]]:
    """Seconds per call for each fn, measured in alternating order, after `warmup` rounds."""
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            t0 = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - t0)
    return times


def table(title: str, times: dict[str, list[float]], base: str,
          goals: dict[str, float]) -> None:
    print(f"\n{title}")
    print(f"  {'variant':26s} {'median ms':>10s} {'p25-p75 ms':>15s} {'ratio':>7s} "
          f"{'paired':>7s}  goal")
    ref = statistics.median(times[base])
    for name, ts in times.items():
        med = statistics.median(ts)
        q = statistics.quantiles(ts, n=4)
        paired = statistics.median(t / b for t, b in zip(ts, times[base], strict=True))
        goal = goals.get(name)
        verdict = "" if goal is None else (f"<= {goal:.2f}x  "
                                           + ("met" if med / ref <= goal else "NOT MET"))
        print(f"  {name:26s} {1e3 * med:10.2f} {1e3 * q[0]:7.2f}-{1e3 * q[2]:<7.2f} "
              f"{med / ref:6.2f}x {paired:6.2f}x  {verdict}")


def bench_update(model: torch.nn.Module, repeats: int, warmup: int) -> None:
    fns = {}
    for name, (_, opt, naive) in optimizers(model).items():
        fns[name] = naive_threshold(opt.step) if naive else opt.step
    times = interleaved(fns, repeats, warmup)
    table("(a) optimizer step alone (grads set; ratio = variant / AdamW)", times,
          "AdamW (foreach)", {"FedACT": GOAL_UPDATE})


def bench_local_step(model: torch.nn.Module, repeats: int, warmup: int) -> None:
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(BATCH, 1, 28, 28, generator=gen)
    y = torch.randint(0, 10, (BATCH,), generator=gen)

    def local_step(twin: torch.nn.Module, opt: torch.optim.Optimizer) -> Callable[[], None]:
        def run() -> None:
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(twin(x), y).backward()
            opt.step()
        return run

    fns = {name: local_step(twin, opt) for name, (twin, opt, naive) in optimizers(model).items()
           if not naive}
    times = interleaved(fns, repeats, warmup)
    table(f"(b) full local step: forward + backward + update, batch {BATCH} x 1x28x28",
          times, "AdamW (foreach)", {"FedACT": GOAL_STEP})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads (default: torch's default)")
    parser.add_argument("--repeats", type=int, default=21,
                        help="timed repetitions per variant (default 21; (b) uses half)")
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    start = time.perf_counter()
    model = vit_with_dense_grads()
    params = sum(p.numel() for p in model.parameters())
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}")
    print(f"ViT-Tiny 1x28x28 -> 10: D = {params:,} parameters in "
          f"{len(list(model.parameters()))} tensors; FedACT: adamw, rho=0.5 with a Delta_G, "
          f"act tau=0.5 (top {int(0.5 * params):,} of D); weight decay {WD} in both")
    check_naive_matches(model)
    print("check: sampled and naive kthvalue thresholds give bit-identical updates")
    bench_update(model, args.repeats, args.warmup)
    bench_local_step(model, max(args.repeats // 2, 3), max(args.warmup - 1, 1))
    print(f"\ngoals: (a) FedACT update <= {GOAL_UPDATE:.2f}x AdamW, "
          f"(b) FedACT local step <= {GOAL_STEP:.2f}x AdamW")
    print(f"p25-p75 spread shows the noise; load average now {os.getloadavg()[0]:.2f}; "
          f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
