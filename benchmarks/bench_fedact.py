"""FedACT's local update vs torch's AdamW, side by side in one process, on CPU or CUDA.

    python benchmarks/bench_fedact.py [--device cpu|cuda] [--model vit-tiny|vit-s|cnn]
                                      [--threads N] [--repeats R] [--diagnostics-every N]

A script, not a test. It prints, as ratios against torch's `AdamW(fused=True)` (what users run:
the default on CUDA, one word on CPU) timed in the same process, `AdamW(foreach=True)` beside it
for information:
  (a) the optimizer step alone (gradients set): FedACT, and FedACT with PosRatio/TopMass on
      that step (what a diagnostics step costs);
  (b) a full local step (forward, backward, update) on a batch of images;
  (c) the diagnostics' share of a local round: K steps with PosRatio/TopMass on every N-th
      step against K steps without.
Every variant runs once per repetition, in alternating order, so bursts of load from other
processes fall on all alike; medians and the ratio of the medians are reported, with the load
before and after. On CUDA every timing is synchronised. Before timing, FedACT's selection is
checked against torch.topk. The first line names the CPU, its vector extensions and the one
torch's kernels use (or the GPU).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from adaptfl.local_update import LocalUpdate, band
from adaptfl.local_update.topk import topk_mask
from adaptfl.workloads import build_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import describe, load  # noqa: E402

GOALS = {"update": 2.0, "step": 1.05, "diagnostics": 0.05}
WD = 0.01  # torch AdamW's default and FedACT's preset
# as clients build it (client_app/session.py): parameters as views of one flat buffer
FEDACT = dict(preconditioner="adamw", lr=1e-3, weight_decay=WD, rho=0.5, trust="act", tau=0.5,
              parameters_as_bucket_view=True)


def model_with_dense_grads(name: str, device: str, batch: int) -> torch.nn.Module:
    """The model after two AdamW steps, with a fresh gradient set: torchvision zero-initialises
    the classifier head, so the very first gradients are exactly 0 outside it (all scores tie)."""
    torch.manual_seed(0)
    model = build_model(name, 10, 1, 28).to(device)
    x, y = torch.randn(batch, 1, 28, 28, device=device), torch.randint(0, 10, (batch,), device=device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for i in range(3):
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        if i < 2:
            opt.step()
    return model


def twin(model: torch.nn.Module) -> torch.nn.Module:
    copy_ = copy.deepcopy(model)
    for p, q in zip(model.parameters(), copy_.parameters(), strict=True):
        q.grad = p.grad.clone()  # deepcopy drops .grad
    return copy_


def fedact(model: torch.nn.Module, diagnostics_every: int = 0) -> LocalUpdate:
    opt = LocalUpdate(model.named_parameters(), **FEDACT, diagnostics_every=diagnostics_every)
    gen = torch.Generator().manual_seed(1)
    opt.set_global_direction({n: 1e-3 * torch.randn(p.shape, generator=gen).to(p)
                              for n, p in model.named_parameters()})
    return opt


BASE, INFO, RADIX = "AdamW (fused)", "AdamW (foreach)", "FedACT, radix only (no band)"


def radix_only(step: Callable[[], object]) -> Callable[[], object]:
    """step() with the CPU's band selection switched off: every top-k is the radix selection
    on the CPU's branches, as before the band (local_update/band.py)."""
    def run() -> object:
        real = band.select, band.previous_band
        band.select = band.previous_band = lambda *args, **kwargs: None
        try:
            return step()
        finally:
            band.select, band.previous_band = real
    return run


def adamw(model: torch.nn.Module, kind: str = "fused") -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=WD, **{kind: True})


def check_selection(model: torch.nn.Module) -> None:
    """The exact top-⌊τD⌋ of FedACT's scores is torch.topk's set (ties to the lower index)."""
    gen = torch.Generator().manual_seed(5)
    scores = torch.randn(sum(p.numel() for p in model.parameters()), generator=gen)
    scores[::7] = 0.0  # ties
    k = scores.numel() // 2
    ours = topk_mask(scores.to(next(model.parameters()).device), k).cpu()
    order = torch.sort(scores, descending=True, stable=True).indices[:k]
    expected = torch.zeros_like(ours)
    expected[order] = True
    if not torch.equal(ours, expected):
        raise SystemExit("FAILED: the selection differs from torch.topk's set")


CLOCK = time.perf_counter  # --clock cpu: time.thread_time (1 thread: the CPU time this thread ran)


def interleaved(fns: dict[str, Callable[[], object]], repeats: int, warmup: int, device: str
                ) -> dict[str, list[float]]:
    """Seconds per call for each fn, in alternating order, after `warmup` rounds."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    sync()
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            t0 = CLOCK()
            fns[name]()
            sync()
            times[name].append(CLOCK() - t0)
    return times


def table(title: str, times: dict[str, list[float]], base: str, goals: dict[str, float]) -> dict:
    print(f"\n{title}")
    print(f"  {'variant':30s} {'median ms':>10s} {'ratio':>7s}  goal")
    ref = statistics.median(times[base])
    ratios = {}
    for name, ts in times.items():
        med = statistics.median(ts)
        ratios[name] = med / ref
        goal = goals.get(name)
        verdict = "" if goal is None else f"<= {goal:.2f}x  " + ("met" if med / ref <= goal else "NOT MET")
        print(f"  {name:30s} {1e3 * med:10.3f} {med / ref:6.2f}x  {verdict}")
    return ratios


def local_step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor,
               y: torch.Tensor) -> Callable[[], None]:
    def run() -> None:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--model", choices=("vit-tiny", "vit-s", "cnn"), default="vit-tiny")
    parser.add_argument("--batch", type=int, default=None, help="default: 50 on CPU, 128 on CUDA")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (CPU)")
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--diagnostics-every", type=int, default=10, help="N for (c)")
    parser.add_argument("--round-steps", type=int, default=20, help="K for (c)")
    parser.add_argument("--only", choices=("update",), default=None, help="just (a)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="cpu: this thread's CPU time (needs --threads 1; robust to other "
                        "processes taking the cores, not to their use of the memory bus)")
    args = parser.parse_args()
    if args.clock == "cpu":
        if args.threads != 1 or args.device != "cpu":
            raise SystemExit("--clock cpu needs --device cpu --threads 1")
        global CLOCK
        CLOCK = time.thread_time
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    batch = args.batch or (128 if args.device == "cuda" else 50)
    start = time.perf_counter()
    model = model_with_dense_grads(args.model, args.device, batch)
    params = sum(p.numel() for p in model.parameters())
    print(describe(args.device) + f"; clock: {args.clock}")
    print(f"{args.model} 1x28x28 -> 10: D = {params:,} in {len(list(model.parameters()))} tensors; "
          f"FedACT: adamw, rho=0.5 with a Delta_G, act tau=0.5; weight decay {WD} in both")
    check_selection(model)
    print("check: the selection is torch.topk's set")
    base = BASE
    m_a, m_f, m_d, m_i = twin(model), twin(model), twin(model), twin(model)
    m_r = twin(model)
    update = {base: adamw(m_a).step, "FedACT": fedact(m_f).step,
              "FedACT, diagnostics this step": fedact(m_d, diagnostics_every=1).step,
              INFO: adamw(m_i, "foreach").step}  # for information: the slower torch reference
    if args.device == "cpu":  # for information: the radix selection alone, as before issue 23
        update[RADIX] = radix_only(fedact(m_r).step)
    ratio_a = table(f"(a) optimizer step alone (grads set); ratio to {base}",
                   interleaved(update, args.repeats, args.warmup, args.device), base,
                   {"FedACT": GOALS["update"]})
    if args.only == "update":
        print(f"\nsummary {args.device} {args.model}: update {ratio_a['FedACT']:.2f}x {base} "
              f"({ratio_a['FedACT'] / ratio_a[INFO]:.2f}x {INFO}); {load()} at the end")
        return
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(batch, 1, 28, 28, generator=gen).to(args.device)
    y = torch.randint(0, 10, (batch,), generator=gen).to(args.device)
    m_a, m_f = twin(model), twin(model)
    steps = {base: local_step(m_a, adamw(m_a), x, y),
             "FedACT": local_step(m_f, fedact(m_f), x, y)}
    ratio_b = table(f"(b) full local step: forward + backward + update, batch {batch}",
                    interleaved(steps, args.repeats, 1, args.device), base,
                    {"FedACT": GOALS["step"]})
    m_off, m_on = twin(model), twin(model)
    off, on = fedact(m_off), fedact(m_on, diagnostics_every=args.diagnostics_every)
    k = args.round_steps

    def round_of(m: torch.nn.Module, opt: LocalUpdate) -> Callable[[], None]:
        step = local_step(m, opt, x, y)

        def run() -> None:
            opt.steps = 0  # a fresh round: diagnostics on steps 1, 1+N, …
            for _ in range(k):
                step()
            opt.diagnostics()  # read once per round, as a client does
        return run

    rounds = {"round, no diagnostics": round_of(m_off, off),
              f"round, diagnostics every {args.diagnostics_every}": round_of(m_on, on)}
    times = interleaved(rounds, max(args.repeats // 4, 3), 1, args.device)
    share = statistics.median(times[f"round, diagnostics every {args.diagnostics_every}"]) / \
        statistics.median(times["round, no diagnostics"]) - 1.0
    verdict = "met" if share <= GOALS["diagnostics"] else "NOT MET"
    print(f"\n(c) a local round of K={k} steps: diagnostics cost {100 * share:+.1f}% "
          f"(goal <= {100 * GOALS['diagnostics']:.0f}%: {verdict})")
    print(f"\nsummary {args.device} {args.model}: update {ratio_a['FedACT']:.2f}x {base}, with diagnostics "
          f"{ratio_a['FedACT, diagnostics this step']:.2f}x, full step {ratio_b['FedACT']:.2f}x, "
          f"diagnostics {100 * share:+.1f}% of a round; {time.perf_counter() - start:.0f} s, "
          f"{load()} at the end")


if __name__ == "__main__":
    main()
