"""A whole local step never reads a tensor back to the host (issue: the GPU stalled at every
step): counted with the profiler on CPU, the CPU tensors sent down the accelerator's branches
(`accelerator_paths`; the CPU's band selection reads counts on purpose), so CI holds the
property without a GPU; on CUDA the same step runs under `torch.cuda.set_sync_debug_mode("error")`."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from adaptfl.local_update import LocalUpdate
from tests.support.sync_check import host_reads

VARIANTS = {
    "fedact": dict(preconditioner="adamw", rho=0.5, trust="act", tau=0.5),
    "fedact-per-tensor": dict(preconditioner="adamw", rho=0.5, trust="act", trust_scope="per-tensor"),
    "mgup": dict(preconditioner="adamw", trust="mgup"),
    "cautious": dict(preconditioner="adamw", trust="cautious"),
    "fedadamw": dict(preconditioner="adamw", rho=0.5),
    "sgd": dict(preconditioner="sgd"),
    "sophia": dict(preconditioner="sophia", rho=0.5),
    "soap-act": dict(preconditioner="soap", trust="act"),
}


def _model(device: str) -> torch.nn.Module:
    torch.manual_seed(0)  # D > 16k: the radix path of the selection, not the small-D sort
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 10)).to(device)


def _stepper(name: str, diagnostics: bool, device: str):  # noqa: ANN202
    model = _model(device)
    opt = LocalUpdate(model.named_parameters(), lr=1e-3, diagnostics_every=int(diagnostics),
                      **VARIANTS[name])
    if VARIANTS[name].get("rho"):
        opt.set_global_direction({n: torch.full_like(p, 1e-3) for n, p in model.named_parameters()})
    x = torch.randn(32, 64, device=device)
    y = torch.randint(0, 10, (32,), device=device)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    step()  # SOAP's first step only initialises
    return step, opt


@pytest.mark.parametrize("diagnostics", [False, True])
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_a_local_step_reads_nothing_back_to_the_host(name: str, diagnostics: bool,
                                                     accelerator_paths: None) -> None:
    step, opt = _stepper(name, diagnostics, "cpu")
    assert host_reads(step) == []
    if diagnostics:  # the diagnostics are read once, when the round ends
        assert set(opt.diagnostics()) == {"pos-ratio", "top-mass"}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", ["fedact", "fedact-per-tensor", "cautious", "fedadamw"])
def test_a_local_step_runs_under_cuda_sync_debug_mode_error(name: str) -> None:
    step, _ = _stepper(name, False, "cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
