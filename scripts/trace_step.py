"""Which package files and functions one FedACT local step runs: a trace of `LocalUpdate.step`
on the MLP (784-64-10) with FedACT's settings, after two warm-up steps (the band exists).

    python scripts/trace_step.py            # the native form where the C loops build
    ADAPTFL_NATIVE=0 python scripts/trace_step.py   # the fused form
"""

from __future__ import annotations

import sys
from collections import Counter
from types import FrameType
from typing import Any

import torch

from adaptfl.local_update import LocalUpdate


def main() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(784, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    opt = LocalUpdate(model.named_parameters(), lr=1e-3, weight_decay=0.01, preconditioner="adamw",
                      trust="act", tau=0.5, rho=0.5, step_offset=50, parameters_as_bucket_view=True)
    opt.set_global_direction({n: 1e-3 * torch.randn_like(p) for n, p in model.named_parameters()})
    calls: Counter[tuple[str, str]] = Counter()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        path = frame.f_code.co_filename
        if event == "call" and "/adaptfl/" in path:
            calls[(path.split("/adaptfl/", 1)[1], frame.f_code.co_name)] += 1

    for k in range(3):
        model(torch.randn(50, 784)).logsumexp(1).sum().backward()
        if k == 2:
            sys.setprofile(profile)
        opt.step()
        sys.setprofile(None)
        opt.zero_grad()
    files = sorted({f for f, _ in calls})
    path = opt.last_path
    print(f"form {path.form}: {path.reason}" if path else "no step taken")
    print(f"{len(files)} package files, {len(calls)} functions in one step:")
    for f in files:
        print(f"  {f}: {', '.join(sorted(n for g, n in calls if g == f))}")


if __name__ == "__main__":
    main()
