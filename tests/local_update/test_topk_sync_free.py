"""The top-k selection, the trust modulation and the diagnostics never read a value on the host.

On CPU the profiler counts the ops through which a host read goes (tests/support/sync_check.py) and
requires none, with CPU tensors sent down the accelerator's branches (`accelerator_paths`: the
CPU's own band selection reads counts on purpose, local_update/band.py); with a GPU the same
calls run under `torch.cuda.set_sync_debug_mode("error")`, which raises on any synchronising
call, and must agree with the CPU bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from adaptfl.local_update import topk, trust
from adaptfl.local_update.workspace import Workspace
from tests.support.sync_check import host_reads

N = 3 * topk._SMALL + 5  # the radix path (blocks and a tail)
SEGMENTS = [topk._SMALL + 3, 700, topk._SMALL * 2, 2]  # per-tensor: radix and sort paths


def _scores(n: int, device: str | torch.device = "cpu") -> torch.Tensor:
    gen = torch.Generator().manual_seed(n)
    s = torch.randn(n, generator=gen) * torch.randn(n, generator=gen)
    s[: n // 10] = 0.0  # ties at zero, some of them -0.0
    s[: n // 20] = -0.0
    return s.to(device)


def _calls(device: str | torch.device) -> dict[str, Callable[[], object]]:
    """name -> a call on fresh device tensors (made here, outside the measured call)."""
    ws = Workspace()
    x, u, g = _scores(N, device), _scores(N + 1, device)[:N], _scores(N + 2, device)[:N]
    seg = sum(SEGMENTS)
    us, gs = _scores(seg, device), _scores(seg + 1, device)[:seg]

    def modulate(mode: str, per_tensor: bool, u: torch.Tensor, g: torch.Tensor,
                 sizes: list[int]) -> Callable[[], object]:
        return lambda: trust.modulate_(u.clone(), g, mode, 0.5, 2.0, 0.5, sizes,
                                       per_tensor=per_tensor, ws=ws)

    return {
        "topk_indicator_": lambda: topk.topk_indicator_(x.clone(), N // 2, ws),
        "topk_indicator_ small": lambda: topk.topk_indicator_(x[:999].clone(), 300, ws),
        "topk_indicator_ k=0, k=D": lambda: (topk.topk_indicator_(x.clone(), 0, ws),
                                             topk.topk_indicator_(x.clone(), N, ws)),
        "topk_mask": lambda: topk.topk_mask(x, N // 3, ws),
        "kth_largest": lambda: topk.kth_largest(x, 17, ws),
        "topk_sum_positive": lambda: topk.topk_sum_positive(x, N // 100, ws),
        "act_phi_ global": lambda: trust.act_phi_(x.clone(), 0.5, 2.0, 0.5, None, ws),
        "act_phi_ segments": lambda: trust.act_phi_(us.clone(), 0.3, 2.0, 0.5, SEGMENTS, ws),
        "modulate_ act global": modulate("act", False, u, g, [N]),
        "modulate_ act per-tensor": modulate("act", True, us, gs, SEGMENTS),
        "modulate_ mgup": modulate("mgup", False, us, gs, SEGMENTS),
        "modulate_ cautious": modulate("cautious", False, u, g, [N]),
        "pos_ratio": lambda: trust.pos_ratio(x, ws),
        "top_mass": lambda: trust.top_mass(x, ws=ws),
        "top_mass, no positive mass": lambda: trust.top_mass(-x.abs(), ws=ws),
    }


def test_the_probe_sees_host_reads() -> None:
    x = torch.randn(10)
    assert host_reads(lambda: int(torch.count_nonzero(x > 0))) != []
    assert host_reads(lambda: x[x > 0]) == ["aten::nonzero"]
    assert host_reads(lambda: x.sum() + 1) == []


@pytest.mark.parametrize("name", list(_calls("cpu")))
def test_no_host_reads_on_cpu(name: str, accelerator_paths: None) -> None:
    call = _calls("cpu")[name]
    call()  # first call: workspace buffers are allocated
    assert host_reads(call) == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
@pytest.mark.parametrize("name", list(_calls("cpu")))
def test_no_sync_on_cuda_and_same_result_as_cpu(name: str) -> None:
    call = _calls("cuda")[name]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = call()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    expected = _calls("cpu")[name]()
    got_t = got if isinstance(got, tuple) else (got,)
    exp_t = expected if isinstance(expected, tuple) else (expected,)
    for a, b in zip(got_t, exp_t, strict=True):
        assert torch.equal(a.cpu(), b) or torch.allclose(a.cpu(), b, rtol=1e-6, atol=0)
