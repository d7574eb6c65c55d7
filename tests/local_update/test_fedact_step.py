"""FedACT's local step computed by hand on tiny tensors, and the exact top-k selection."""

from __future__ import annotations

import math

import pytest
import torch

import adaptfl.local_update.topk as topk
from adaptfl.local_update import LocalUpdate
from adaptfl.local_update.trust import top_mass


def _one_step(values: dict[str, list[float]], grads: dict[str, list[float]],
              cfg: dict, delta_g: dict[str, list[float]] | None = None,
              v_bar: dict[str, list[float]] | None = None) -> dict[str, list[float]]:
    params = {n: torch.nn.Parameter(torch.tensor(v, dtype=torch.float64)) for n, v in values.items()}
    dg = {n: torch.tensor(v, dtype=torch.float64) for n, v in delta_g.items()} if delta_g else None
    opt = LocalUpdate(params.items(), **cfg)
    if dg is not None:
        opt.set_global_direction(dg)
    if v_bar:
        opt.import_state("exp_avg_sq", {n: torch.tensor(v, dtype=torch.float64)
                                        for n, v in v_bar.items()})
    for n, p in params.items():
        p.grad = torch.tensor(grads[n], dtype=torch.float64)
    opt.step()
    return {n: p.detach().tolist() for n, p in params.items()}


def test_one_fedact_step_by_hand() -> None:
    # Two tensors, D = 5, τ = 0.4 -> ⌊τD⌋ = 2 coordinates get α over the WHOLE model.
    x = {"w": [1.0, -2.0, 0.5], "b": [0.3, -0.7]}
    g = {"w": [0.2, -0.1, 0.4], "b": [-0.01, 0.005]}
    dg = {"w": [0.5, 0.5, 1.0], "b": [-0.2, 0.1]}
    vbar = {"w": [0.01, 0.04, 0.09], "b": [0.0, 0.16]}
    b1, b2, eps, lr, wd, rho, tau, alpha, gamma = 0.9, 0.999, 1e-8, 0.1, 0.01, 0.5, 0.4, 2.5, 0.4
    t = 11  # step_offset 10 (round 2 with K = 10), first local step k = 1
    cfg = dict(preconditioner="adamw", lr=lr, weight_decay=wd, beta1=b1, beta2=b2, eps=eps,
               bias_correction="paper", rho=rho, trust="act", tau=tau, alpha=alpha, gamma=gamma,
               step_offset=10)
    got = _one_step(x, g, cfg, dg, vbar)

    flat = lambda d: d["w"] + d["b"]  # noqa: E731
    xs, gs, dgs, vs = flat(x), flat(g), flat(dg), flat(vbar)
    u, s = [], []
    for gi, dgi, vi in zip(gs, dgs, vs, strict=True):
        m_hat = (0.1 * gi) / (1 - b1**1)  # m from 0, bias on k = 1
        v_hat = (b2 * vi + (1 - b2) * gi * gi) / (1 - b2**t)  # v from v̄, bias on t
        ui = (1 - rho) * m_hat / (math.sqrt(v_hat) + eps) + rho * dgi
        u.append(ui)
        s.append(ui * gi)
    top = sorted(range(5), key=lambda i: -s[i])[:2]
    expected = [(1 - lr * wd) * xi - lr * (alpha if i in top else gamma) * ui
                for i, (xi, ui) in enumerate(zip(xs, u, strict=True))]
    assert flat(got) == pytest.approx(expected, rel=1e-12, abs=1e-12)
    assert sorted(top) == [0, 2]  # both winners in "w": the ranking is global, not per tensor


def test_ties_in_the_scores_break_to_the_lower_index() -> None:
    # ρ = 1 makes u = Δ_G exactly, so the scores s = Δ_G ⊙ g tie exactly.
    x = {"w": [0.0] * 6}
    g = {"w": [1.0, 1.0, 1.0, 1.0, 1.0, 1.0]}
    dg = {"w": [3.0, 1.0, 1.0, 1.0, -2.0, 0.0]}  # scores 3, 1, 1, 1, -2, 0; k = ⌊0.5·6⌋ = 3
    cfg = dict(preconditioner="sgd", weight_decay=0.0, lr=1.0, rho=1.0, trust="act", tau=0.5,
               alpha=2.0, gamma=0.5)
    got = _one_step(x, g, cfg, dg)["w"]
    phi = [2.0, 2.0, 2.0, 0.5, 0.5, 0.5]  # the first two of the three tied 1's win
    assert got == [-p * d for p, d in zip(phi, dg["w"], strict=True)]


def test_tau_one_is_the_plain_corrected_step() -> None:
    x = {"w": [1.0, 2.0, 3.0]}
    g = {"w": [0.5, -1.0, 2.0]}
    dg = {"w": [0.1, 0.2, -0.3]}
    cfg = dict(preconditioner="sgd", weight_decay=0.0, lr=0.1, rho=0.25, trust="act", tau=1.0,
               alpha=1.0, gamma=1.0)
    got = _one_step(x, g, cfg, dg)["w"]
    expected = [xi - 0.1 * (0.75 * gi + 0.25 * di)
                for xi, gi, di in zip(x["w"], g["w"], dg["w"], strict=True)]
    assert got == pytest.approx(expected, rel=1e-12)


def test_per_tensor_scope_ranks_within_each_tensor() -> None:
    x = {"w": [0.0, 0.0], "b": [0.0, 0.0]}
    g = {"w": [1.0, 1.0], "b": [1.0, 1.0]}
    dg = {"w": [5.0, 4.0], "b": [1.0, 2.0]}  # global top-2 would be both of w
    cfg = dict(preconditioner="sgd", weight_decay=0.0, lr=1.0, rho=1.0, trust="act", tau=0.5,
               alpha=2.0, gamma=0.5, trust_scope="per-tensor")
    got = _one_step(x, g, cfg, dg)
    assert got == {"w": [-10.0, -2.0], "b": [-0.5, -4.0]}


@pytest.mark.parametrize("n", [10, 1000, 300_000])
@pytest.mark.parametrize("k_frac", [0.001, 0.5, 0.999])
def test_kth_largest_is_exact(n: int, k_frac: float) -> None:
    gen = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=gen)
    k = max(1, int(k_frac * n))
    assert torch.equal(topk.kth_largest(x, k), torch.topk(x, k).values[-1])


def test_topk_mask_is_exact_with_heavy_ties_on_the_radix_path() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(-5, 5, (400_000,), generator=gen).float()  # 10 distinct values
    k = 123_457
    mask = topk.topk_mask(x, k)
    assert int(mask.sum()) == k
    threshold = torch.topk(x, k).values[-1]
    assert bool((x[mask] >= threshold).all()) and bool((x[~mask] <= threshold).all())
    tied = torch.nonzero(x == threshold).squeeze(1)
    chosen = mask[tied]
    assert bool(chosen[: int(chosen.sum())].all())  # lowest indices of the tie win


def test_kth_largest_rejects_bad_k() -> None:
    with pytest.raises(ValueError, match="k=0"):
        topk.kth_largest(torch.ones(3), 0)


def test_top_mass_by_hand() -> None:
    s = torch.tensor([4.0, -1.0, 1.0, 0.0] + [0.0] * 96)  # ⌈0.01·100⌉ = 1 top score
    assert top_mass(s, 0.01) == pytest.approx(4.0 / 5.0)
    assert top_mass(-s.abs(), 0.01) == 0.0


def test_round_one_without_delta_g_scales_d_by_one_minus_rho() -> None:
    # Algorithm 1 starts from Δ_G^0 = 0: the first round's u is (1-ρ)·d, not d.
    x, g = {"w": [1.0, -1.0]}, {"w": [0.5, 2.0]}
    cfg = dict(preconditioner="sgd", weight_decay=0.0, lr=0.1, rho=0.25)
    got = _one_step(x, g, cfg, delta_g=None)["w"]
    assert got == pytest.approx([1.0 - 0.1 * 0.75 * 0.5, -1.0 - 0.1 * 0.75 * 2.0], rel=1e-12)


def test_gamma_zero_is_hard_masking() -> None:
    """The paper's Table 4 ablation: γ = 0 drops every untrusted coordinate."""
    x, g = {"w": [0.0] * 4}, {"w": [1.0] * 4}
    dg = {"w": [4.0, -1.0, 3.0, 2.0]}  # scores 4, -1, 3, 2: top ⌊0.5·4⌋ = 2 are 4 and 3
    cfg = dict(preconditioner="sgd", weight_decay=0.0, lr=1.0, rho=1.0, trust="act", tau=0.5, gamma=0.0)
    assert _one_step(x, g, cfg, dg)["w"] == [-8.0, 0.0, -6.0, 0.0]  # α = 1/τ = 2 on the top
