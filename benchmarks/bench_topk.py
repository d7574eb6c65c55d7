"""The exact top-⌊τD⌋ selection: this device's path, the sync-free radix, the old band, torch's own.

    python benchmarks/bench_topk.py [--device cpu|cuda] [--numel D] [--tau T] [--repeats R]
                                    [--threads N]

A script, not a test. Scores are s = u ⊙ g stand-ins (a product of two Gaussians, no ties),
D = ViT-Tiny's 5.35M by default. Every variant writes the 0/1 indicator of the top ⌊τD⌋ into
a fresh copy of the scores (the copy is not timed) and must select the identical mask:

- this device's path: `topk_indicator_` (local_update/topk.py); on CPU the band around the
  previous call's threshold (band.py; here every repeat sees the same scores, its best case),
  on CUDA the radix selection;
- radix (accelerator path): the same call with CPU tensors sent down the accelerator's branch
  (local_update/devices.py): no host read, fixed kernel sequence;
- band: the sampled-band selection it replaced (benchmarks/topk_band_reference.py), which
  reads counts back to the host;
- kthvalue: one `torch.kthvalue` over all of D, then x >= t;
- topk: `torch.topk` indices scattered into a mask.

A second table times the per-step diagnostics (PosRatio + TopMass_0.01, seed 000 App. A), old
(floats read on the host) vs new (0-dim tensors). Variants run in alternating order (A B C ..
/ .. C B A) so bursts of load from other processes fall on all alike; we print medians, the
p25-p75 spread and the ratio of medians to this device's path.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere, uninstalled
sys.path.insert(0, str(Path(__file__).resolve().parent))

import topk_band_reference as band  # noqa: E402
from machine import describe  # noqa: E402

from adaptfl.local_update import devices, topk, trust  # noqa: E402
from adaptfl.local_update.workspace import Workspace  # noqa: E402

VIT_TINY = 5_350_000  # ≈ ViT-Tiny's D (1x28x28 -> 10 classes)
PATH = "this device's path"


def accelerator(fn: Callable, *args: object) -> object:
    """fn(*args) with CPU tensors sent down the accelerator's branches."""
    devices.ACCELERATOR_PATHS_ON_CPU = True
    try:
        return fn(*args)
    finally:
        devices.ACCELERATOR_PATHS_ON_CPU = False


def scores(n: int, device: torch.device) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    s = torch.randn(n, generator=gen) * torch.randn(n, generator=gen) * 1e-3
    return s.to(device)


def selections(x: torch.Tensor, k: int) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    """name -> fn(buffer holding a copy of x) -> 0/1 indicator of the top k (may be the buffer)."""
    ws_path, ws_radix, ws_band = Workspace(), Workspace(), Workspace()
    n = x.numel()

    def kthvalue(buf: torch.Tensor) -> torch.Tensor:
        t = torch.kthvalue(buf, n - k + 1).values  # exact; no ties in these scores
        return torch.ge(buf, t, out=buf)

    def topk_mask(buf: torch.Tensor) -> torch.Tensor:
        idx = torch.topk(buf, k, sorted=False).indices
        return buf.zero_().index_fill_(0, idx, 1.0)

    return {
        PATH: lambda buf: topk.topk_indicator_(buf, k, ws_path),
        "radix (accelerator path)": lambda buf: accelerator(topk.topk_indicator_, buf, k, ws_radix),
        "band (old)": lambda buf: band.topk_indicator_(buf, k, ws_band),
        "torch.kthvalue": kthvalue,
        "torch.topk": topk_mask,
    }


def diagnostics(x: torch.Tensor) -> dict[str, Callable[[torch.Tensor], object]]:
    ws_new, ws_old = Workspace(), Workspace()

    def old(s: torch.Tensor) -> tuple[float, float]:
        n = s.numel()
        ratio = int(torch.count_nonzero(s > 0)) / n
        positive = float(s.clamp(min=0).sum())
        top = float(band.topk_sum_positive(s, math.ceil(0.01 * n), ws_old)) / positive
        return ratio, top

    return {
        PATH: lambda s: (trust.pos_ratio(s, ws_new), trust.top_mass(s, ws=ws_new)),
        "band (old)": old,
    }


def timed(fns: dict[str, Callable[[torch.Tensor], object]], x: torch.Tensor, repeats: int,
          warmup: int) -> dict[str, list[float]]:
    """Seconds per call of each fn on a fresh copy of x, in alternating order."""
    buf = torch.empty_like(x)
    cuda = x.device.type == "cuda"
    names = list(fns)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(warmup + repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            buf.copy_(x)
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            fns[name](buf)
            if cuda:
                torch.cuda.synchronize()
            if r >= warmup:
                times[name].append(time.perf_counter() - t0)
    return times


def table(title: str, times: dict[str, list[float]], base: str) -> None:
    print(f"\n{title}")
    print(f"  {'variant':26s} {'median ms':>10s} {'p25-p75 ms':>17s} {'/ path':>8s}")
    ref = statistics.median(times[base])
    for name, ts in times.items():
        med = statistics.median(ts)
        q = statistics.quantiles(ts, n=4)
        print(f"  {name:26s} {1e3 * med:10.2f} {1e3 * q[0]:8.2f}-{1e3 * q[2]:<8.2f} "
              f"{med / ref:7.2f}x")


def check_identical(x: torch.Tensor, fns: dict[str, Callable[[torch.Tensor], torch.Tensor]]
                    ) -> None:
    masks = {name: fn(x.clone()).bool() for name, fn in fns.items()}
    ref = masks[PATH]
    k = int(ref.sum())
    for name, mask in masks.items():
        if not torch.equal(mask, ref):
            raise SystemExit(f"FAILED: {name} selects a different set than this device's path")
    print(f"check: all {len(masks)} variants select the identical {k:,} coordinates")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default cpu)")
    parser.add_argument("--numel", type=int, default=VIT_TINY, help="D (default ViT-Tiny's)")
    parser.add_argument("--tau", type=float, default=0.5, help="selected share (default 0.5)")
    parser.add_argument("--repeats", type=int, default=21, help="timed repetitions (default 21)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads (default: torch's default)")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here")
    x = scores(args.numel, device)
    k = math.floor(args.tau * args.numel)
    print(describe(str(device)))
    print(f"D = {args.numel:,} scores (float32), top k = floor({args.tau} D) = {k:,}")
    fns = selections(x, k)
    check_identical(x, fns)
    start = time.perf_counter()
    table("top-k indicator (ratio = variant / this device's path)",
          timed(fns, x, args.repeats, args.warmup), PATH)
    table("PosRatio + TopMass_0.01 (ratio = variant / this device's path)",
          timed(diagnostics(x), x, args.repeats, args.warmup), PATH)
    print(f"\nload average now {os.getloadavg()[0]:.2f}; {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
