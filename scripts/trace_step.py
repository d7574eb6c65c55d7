"""Which package files and functions FedACT's local steps run: a trace of every
`LocalUpdate.step` of one local round (K = 50 steps of the MLP 784-64-10 on batches of 50 drawn
from one fixed distribution, FedACT's settings, PosRatio/TopMass every 10th step as the run
config's default), after a warm-up round on the same optimizer (the band exists).

    python scripts/trace_step.py            # the native form where the C loops build
    ADAPTFL_NATIVE=0 python scripts/trace_step.py   # the fused form

It prints the steps grouped by the set of files they ran, then the files of the common step
(the most frequent set) with its functions. tests/local_update/test_trace.py holds the
common step of the native form to at most 5 files.
"""

from __future__ import annotations

import sys
from collections import Counter
from types import FrameType
from typing import Any

import torch

from adaptfl.local_update import LocalUpdate

Trace = tuple[frozenset[str], frozenset[tuple[str, str]]]  # one step's files and (file, function)s


def trace_round(steps: int = 50, diagnostics_every: int = 10) -> tuple[list[Trace], LocalUpdate]:
    """One traced round after a warm-up round: each step's package files and functions."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(784, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    opt = LocalUpdate(model.named_parameters(), lr=1e-3, weight_decay=0.01, preconditioner="adamw",
                      trust="act", tau=0.5, rho=0.5, step_offset=50, parameters_as_bucket_view=True,
                      diagnostics_every=diagnostics_every)
    opt.set_global_direction({n: 1e-3 * torch.randn_like(p) for n, p in model.named_parameters()})
    centre = torch.randn(10, 784)
    traces: list[Trace] = []
    calls: set[tuple[str, str]] = set()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        path = frame.f_code.co_filename
        if event == "call" and "/adaptfl/" in path:
            calls.add((path.split("/adaptfl/", 1)[1], frame.f_code.co_name))

    for k in range(2 * steps):
        y = torch.randint(0, 10, (50,))
        x = centre[y] + torch.randn(50, 784)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        calls.clear()
        if k >= steps:
            sys.setprofile(profile)
        opt.step()
        sys.setprofile(None)
        opt.zero_grad()
        if k >= steps:
            traces.append((frozenset(f for f, _ in calls), frozenset(calls)))
    return traces, opt


def main() -> None:
    traces, opt = trace_round()
    path = opt.last_path
    print(f"form {path.form}: {path.reason}" if path else "no step taken")
    by_files = Counter(files for files, _ in traces)
    for files, count in by_files.most_common():
        print(f"{count:3d} of {len(traces)} steps ran {len(files)} package files")
    common = by_files.most_common(1)[0][0]
    functions = next(fns for files, fns in traces if files == common)
    print(f"the common step: {len(common)} package files, {len(functions)} functions:")
    for f in sorted(common):
        print(f"  {f}: {', '.join(sorted(n for g, n in functions if g == f))}")


if __name__ == "__main__":
    main()
