"""The fast paths of local_update (reused buffers, radix selection) against plain references.

The references are written the obvious way (a stable sort for the top-k, fresh tensors for every
temporary); the fast paths must agree bit for bit (TopMass: to float rounding).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

import adaptfl.local_update.radix as radix
import adaptfl.local_update.topk as topk
from adaptfl.local_update import LocalUpdate
from adaptfl.local_update.rules import adam
from adaptfl.local_update.step import fused_adam
from adaptfl.local_update.trust import modulate_, pos_ratio, top_mass


def _reference_mask(x: torch.Tensor, k: int) -> torch.Tensor:
    """The k largest entries, ties to the lower index (a stable sort keeps index order)."""
    mask = torch.zeros(x.numel(), dtype=torch.bool)
    mask[torch.sort(x, descending=True, stable=True).indices[:k]] = True
    return mask


def _vectors() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    n = 300_000  # above topk._SMALL: the radix path
    return {
        "gaussian": torch.randn(n, generator=gen),
        "heavy ties": torch.randint(-5, 5, (n,), generator=gen).float(),
        "mostly zero": torch.where(torch.rand(n, generator=gen) < 0.9, 0.0,
                                   torch.randn(n, generator=gen)),
        "small": torch.randn(1000, generator=gen),
    }


@pytest.mark.parametrize("name", list(_vectors()))
@pytest.mark.parametrize("frac", [0.0, 0.01, 0.5, 0.97, 1.0])
def test_topk_mask_and_indicator_match_a_stable_sort(name: str, frac: float) -> None:
    x = _vectors()[name]
    k = math.floor(frac * x.numel())
    expected = _reference_mask(x, k)
    assert torch.equal(topk.topk_mask(x, k), expected)
    ind = topk.topk_indicator_(x.clone(), k)
    assert torch.equal(ind, expected.to(ind.dtype))


@pytest.mark.parametrize(("rows", "cpu_rows", "chunk"),
                         [(1, 1, 1 << 20), (3, 2, 1), (16, 2, 40_000), (16, 16, 1 << 20),
                          (64, 5, 1)])
def test_indicator_does_not_depend_on_the_block_layout(monkeypatch: pytest.MonkeyPatch,
                                                         rows: int, cpu_rows: int,
                                                         chunk: int) -> None:
    # Blocks decide where the tie fix-up happens, chunks how the digits are counted (as on
    # CUDA: all rows at once): neither may change the selection.
    monkeypatch.setattr(radix, "ROWS", rows)
    monkeypatch.setattr(radix, "_CPU_ROWS", cpu_rows)
    monkeypatch.setattr(radix, "_CHUNK", chunk)
    for x in _vectors().values():
        for k in (1, x.numel() // 3, x.numel() - 1):
            assert torch.equal(topk.topk_indicator_(x.clone(), k), _reference_mask(x, k).float())


@pytest.mark.parametrize("name", list(_vectors()))
def test_topk_sum_positive_and_diagnostics(name: str) -> None:
    x = _vectors()[name].double()  # float64: the reference sums in another order
    for k in (1, math.ceil(0.01 * x.numel()), x.numel() // 2):
        ref = torch.sort(x, descending=True).values[:k].clamp(min=0).sum()
        assert float(topk.topk_sum_positive(x, k)) == pytest.approx(float(ref), rel=1e-12)
    positive = float(x.clamp(min=0).sum())
    ref_mass = float(torch.sort(x, descending=True).values[:math.ceil(0.01 * x.numel())]
                     .clamp(min=0).sum()) / positive if positive > 0 else 0.0
    mass, ratio = top_mass(x), pos_ratio(x)
    assert mass.shape == ratio.shape == () and mass.dtype == ratio.dtype == torch.float64
    assert float(mass) == pytest.approx(ref_mass, rel=1e-12)
    assert float(ratio) == int((x > 0).sum()) / x.numel()


def _params(gen: torch.Generator) -> dict[str, torch.nn.Parameter]:
    shapes = {"w1": (300, 400), "b1": (300,), "w2": (10, 300), "b2": (10,)}
    shapes["w0"] = (256, 256)  # D = 188,846 > topk._SMALL: the radix path
    return {n: torch.nn.Parameter(torch.randn(s, generator=gen)) for n, s in shapes.items()}


def _reference_step(x: list[torch.Tensor], grads: list[torch.Tensor], state: dict,
                    dg: torch.Tensor, cfg: SimpleNamespace, k_step: int) -> list[float]:
    """FedACT's local step written plainly, in the same order of float operations."""
    hp = cfg
    g = torch.cat([t.reshape(-1) for t in grads])
    m, v = state["exp_avg"], state["exp_avg_sq"]
    m.lerp_(g, 1 - hp.beta1)
    v.mul_(hp.beta2).addcmul_(g, g, value=1 - hp.beta2)
    bc1, root_bc2 = 1 - hp.beta1**k_step, math.sqrt(1 - hp.beta2**k_step)
    # u = ρ·Δ_G + (1-ρ)·m̂/(sqrt(v̂)+ε), with the bias corrections folded into scalars:
    # m̂/(sqrt(v̂)+ε) = (sqrt(bc2)/bc1)·m/(sqrt(v) + ε·sqrt(bc2))
    denom = v.sqrt().add_(hp.eps * root_bc2)
    u = torch.addcdiv(torch.mul(dg, cfg.rho), m, denom, value=(1 - cfg.rho) * root_bc2 / bc1)
    s = u * g
    # x = (1 - lr·wd)·x + (-lr·φ) ⊙ u: φ ∈ {α, γ}, so -lr·φ is one of two float32 numbers
    step = torch.where(_reference_mask(s, math.floor(cfg.tau * s.numel())), -cfg.lr * cfg.alpha,
                       -cfg.lr * cfg.gamma)
    sizes = [t.numel() for t in x]
    for t, du, f in zip(x, u.split(sizes), step.split(sizes), strict=True):
        t.mul_(1 - cfg.lr * cfg.weight_decay).addcmul_(du.view_as(t), f.view_as(t))
    positive = float(s.clamp(min=0).sum())
    top = torch.sort(s, descending=True).values[:math.ceil(0.01 * s.numel())].clamp(min=0).sum()
    return [int((s > 0).sum()) / s.numel(), float(top) / positive]


@pytest.mark.parametrize("tau", [0.5, 0.1])
def test_fedact_step_is_bitwise_the_plain_formula(tau: float, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fused_adam, "EAGER", True)  # the reference passes; the fused kernel: below
    gen = torch.Generator().manual_seed(7)
    params = _params(gen)
    twins = [p.detach().clone() for p in params.values()]
    dg = {n: 0.01 * torch.randn(p.shape, generator=gen) for n, p in params.items()}
    cfg = SimpleNamespace(lr=1e-2, weight_decay=0.01, rho=0.5, tau=tau, alpha=2.5, gamma=0.4,
                          beta1=0.9, beta2=0.999, eps=1e-8)
    opt = LocalUpdate(params.items(), preconditioner="adamw", lr=cfg.lr, weight_decay=cfg.weight_decay,
                      rho=cfg.rho, trust="act", tau=tau, alpha=cfg.alpha, gamma=cfg.gamma,
                      diagnostics_every=1, bias_correction="local")
    opt.set_global_direction(dg)
    diags = []
    n = sum(p.numel() for p in params.values())
    state = {"exp_avg": torch.zeros(n), "exp_avg_sq": torch.zeros(n)}
    flat_dg = torch.cat([t.reshape(-1) for t in dg.values()])
    for step in range(1, 5):
        grads = [torch.randn(p.shape, generator=gen) * 10.0 ** -step for p in params.values()]
        if step == 1:  # exact zeros: many tied scores at step 1
            grads[0].zero_()
        for p, g in zip(params.values(), grads, strict=True):
            p.grad = g.clone()
        opt.step()
        diag = _reference_step(twins, grads, state, flat_dg, cfg, step)
        for p, t in zip(params.values(), twins, strict=True):
            assert torch.equal(p.detach(), t)
        v = torch.cat([opt.state[p]["exp_avg_sq"].reshape(-1) for p in params.values()])
        assert torch.equal(v, state["exp_avg_sq"])
        diags.append(diag)
        got = opt.diagnostics()  # the mean over the steps so far
        assert got["pos-ratio"] == pytest.approx(sum(d[0] for d in diags) / step, rel=1e-12)
        assert got["top-mass"] == pytest.approx(sum(d[1] for d in diags) / step, rel=1e-5)


def test_cautious_scale_is_the_python_float_formula() -> None:
    # The rescaling D / (nnz + 1) is now a device tensor; it must round as the float did.
    gen = torch.Generator().manual_seed(11)
    u, g = torch.randn(100_003, generator=gen), torch.randn(100_003, generator=gen)
    s = u * g
    expected = u * (s > 0).float() * (u.numel() / (int((s > 0).sum()) + 1))
    got = modulate_(u.clone(), g, "cautious", 0.5, 2.0, 0.5, [u.numel()], per_tensor=False)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("mode", adam.BIAS_MODES)
@pytest.mark.parametrize("fused_correction", [False, True])
def test_the_fused_kernel_is_the_eager_reference_to_rounding(mode: str, fused_correction: bool,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's fused AdamW kernel computing u = ρ·Δ_G + (1-ρ)·m̂/(sqrt(v̂)+ε) (or d alone), with
    both bias corrections on their own step counts, against the eager passes: m and v bit for
    bit, u within a few float32 ulps of its terms, over steps whose k and t differ."""
    gen = torch.Generator().manual_seed(3)
    n = 50_000
    g_steps = [torch.randn(n, generator=gen) * 10.0 ** -(i % 3) for i in range(6)]
    addend = 0.5 * 1e-3 * torch.randn(n, generator=gen)
    state = {True: (torch.zeros(n), torch.zeros(n)), False: (torch.zeros(n), torch.zeros(n))}
    for k, g in enumerate(g_steps, start=1):
        n_m, n_v = adam.bias_steps(mode, k, 40 + k)
        out = {}
        for eager in (True, False):
            monkeypatch.setattr(fused_adam, "EAGER", eager)
            m, v = state[eager]
            d, scale, _ = fused_adam.adam_direction_(m, v, g, 0.9, 0.999, 1e-8, n_m, n_v, out=torch.empty(n),
                                            mix=0.5, addend=addend if fused_correction else None)
            out[eager] = d * scale
        assert torch.equal(state[True][0], state[False][0]) and torch.equal(state[True][1], state[False][1])
        added = addend if fused_correction else torch.zeros(n)
        terms = (added.abs() + (out[True] - added).abs()).clamp(min=1e-30)  # |ρ·Δ_G| + |(1-ρ)·d|
        assert float(((out[True] - out[False]).abs() / terms).max()) < 8 * 2.0**-23, (mode, k)
