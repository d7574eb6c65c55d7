"""The readable reference (local_update/step/reference.py) against hand computations, and every
form of `LocalUpdate`'s elementwise step (the fused form with torch's fused AdamW kernel or its
eager passes, the native CPU loops) against the reference.

The reference runs C clients at once; each client's row must equal that client run alone
through `LocalUpdate`, whatever the other rows hold."""

from __future__ import annotations

import math

import pytest
import torch

from adaptfl.local_update import LocalUpdate, native
from adaptfl.local_update.modulation import ACT, MGUP, Cautious, NoTrust, Trust
from adaptfl.local_update.rules import Step
from adaptfl.local_update.rules.adam import Adam, AdamW
from adaptfl.local_update.rules.sgd import SGD
from adaptfl.local_update.rules.sophia import Sophia
from adaptfl.local_update.step import fused_adam
from adaptfl.local_update.step.reference import Chain, elementwise_step, refresh_hessian
from adaptfl.local_update.step.selection import rows_top_k_mask, top_k_mask

SHAPES = {"w": (6, 5), "b": (5,), "v": (4,)}


def test_fedact_step_by_hand() -> None:
    """seed 000's step on D = 5 computed by hand (the numbers of test_fedact_step.py), for two
    clients whose rows are the same numbers in another order: each row is its own."""
    x = torch.tensor([[1.0, -2.0, 0.5, 0.3, -0.7]], dtype=torch.float64)
    g = torch.tensor([[0.2, -0.1, 0.4, -0.01, 0.005]], dtype=torch.float64)
    dg = torch.tensor([[0.5, 0.5, 1.0, -0.2, 0.1]], dtype=torch.float64)
    vbar = torch.tensor([[0.01, 0.04, 0.09, 0.0, 0.16]], dtype=torch.float64)
    b1, b2, eps, lr, wd, rho, tau, alpha, gamma = 0.9, 0.999, 1e-8, 0.1, 0.01, 0.5, 0.4, 2.5, 0.4
    k, t = 1, 11
    expected = []
    for i in range(5):
        m_hat = (0.1 * g[0, i]) / (1 - b1**k)
        v_hat = (b2 * vbar[0, i] + (1 - b2) * g[0, i] ** 2) / (1 - b2**t)
        u = (1 - rho) * m_hat / (math.sqrt(v_hat) + eps) + rho * dg[0, i]
        expected.append((float(u * g[0, i]), float(u), float(x[0, i])))
    top = sorted(range(5), key=lambda i: -expected[i][0])[:2]
    want = [(1 - lr * wd) * xi - lr * (alpha if i in top else gamma) * ui
            for i, (_, ui, xi) in enumerate(expected)]
    perm = torch.tensor([4, 2, 0, 3, 1])
    stack = lambda a: torch.cat([a, a[:, perm]])  # noqa: E731
    state = {"exp_avg": torch.zeros(2, 5, dtype=torch.float64), "exp_avg_sq": stack(vbar),
             "global_direction": stack(dg)}
    chain = Chain(lr=lr, weight_decay=wd, ref_lr=lr, rho=rho,
                  trust=ACT(tau=tau, alpha=alpha, gamma=gamma))
    new_x, _, _ = elementwise_step(AdamW(beta1=b1, beta2=b2, eps=eps), stack(x), stack(g), state,
                                   Step(k, t), chain)
    assert new_x[0].tolist() == pytest.approx(want, rel=1e-12, abs=1e-12)
    assert new_x[1].tolist() == pytest.approx([want[i] for i in perm.tolist()], rel=1e-12, abs=1e-12)
    assert state["exp_avg"].abs().sum() == 0  # out of place: the inputs are untouched


@pytest.mark.parametrize("values", [
    [3.0, 1.0, 3.0, 2.0, 3.0, 0.0], [0.0, -0.0, 0.0, 1.0], [float("inf"), 1.0, float("-inf"), 1.0],
    [5.0] * 7, [1e-40, 0.0, -1e-40, 2e-40]])
def test_top_k_is_the_stable_sort_with_ties_to_the_lower_index(values: list[float]) -> None:
    row = torch.tensor([values])
    for k in range(len(values) + 1):
        order = sorted(range(len(values)), key=lambda i: (-values[i], i))[:k]
        want = [i in order for i in range(len(values))]
        assert top_k_mask(row, k)[0].tolist() == want, k
        assert rows_top_k_mask(row, k)[0].tolist() == want, k


def test_rows_top_k_equals_the_sort_on_random_rows_with_ties() -> None:
    gen = torch.Generator().manual_seed(3)
    scores = torch.randint(-4, 5, (6, 5000), generator=gen).double() * torch.rand(6, 1, generator=gen)
    for k in (0, 1, 17, 2500, 4999, 5000):
        assert torch.equal(rows_top_k_mask(scores, k), top_k_mask(scores, k))


# --- every path of LocalUpdate against the reference ----------------------------------------

CASES = {  # name: (rule, trust, rho, correction, weight decay)
    "fedact": (AdamW(bias_correction="paper"), ACT(tau=0.3), 0.5, "mix", 0.01),
    "fedact-per-tensor": (AdamW(bias_correction="paper"), ACT(tau=0.3, trust_scope="per-tensor"),
                          0.5, "mix", 0.01),
    "fedadamw": (AdamW(bias_correction="paper"), NoTrust(), 0.5, "mix", 0.01),
    "localadam-coupled": (Adam(bias_correction="local"), NoTrust(), 0.0, "mix", 0.01),
    "fedlada": (Adam(bias_correction="off"), NoTrust(), 0.3, "mix", 0.0),
    "mgup": (AdamW(bias_correction="single-counter"), MGUP(tau=0.5), 0.0, "mix", 0.01),
    "cautious": (AdamW(bias_correction="local"), Cautious(), 0.0, "mix", 0.01),
    "fedavg": (SGD(), NoTrust(), 0.0, "mix", 1e-3),
    "fedcm-act": (SGD(), ACT(tau=0.5, gamma=0.0), 0.4, "mix", 1e-3),
    "fedpac-sophia": (Sophia(hessian_interval=2), NoTrust(), 0.5, "after-step", 0.1),
    "local-sophia-cautious": (Sophia(), Cautious(), 0.0, "mix", 0.1),
    "fedmixp-sophia": (Sophia(hessian_interval=3), NoTrust(), 0.0, "mix", 0.1),
}
LAMBDA = {"fedmixp-sophia": 0.6}  # FedMIX-P's λ: h̃ = (1-λ)·h^r + λ·h


def _client(seed: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s, generator=gen, dtype=dtype) for n, s in SHAPES.items()}


def _flat(tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors.values()])


def _run_alone(rule, trust: Trust, rho: float, correction: str, wd: float, lr: float, seed: int,
               steps: int, dtype: torch.dtype, lam: float = 1.0
               ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """One client through LocalUpdate: warm v̄ / h, Δ_G, `steps` steps; (x, its flat state)."""
    params = {n: torch.nn.Parameter(t) for n, t in _client(seed, dtype).items()}
    opt = LocalUpdate(params.items(), lr=lr, weight_decay=wd, preconditioner=rule, trust=trust,
                      rho=rho, correction=correction, step_offset=20, mix_lambda=lam,
                      parameters_as_bucket_view=True)
    warm = _client(seed + 100, dtype)
    for slot in rule.slots[1:]:  # v̄ (Adam), h (Sophia): positive, as the server's average is
        opt.import_state(slot, {n: t.abs() * 1e-2 for n, t in warm.items()})
    if lam != 1.0:  # FedMIX-P: the reference h^r, then the client's own h drifts from it
        opt.import_theta({f"{n}/hessian": t.abs() * 2e-2 for n, t in _client(seed + 400, dtype).items()},
                         keep_reference=True)
    if rho:
        opt.set_global_direction(_client(seed + 200, dtype))
    gen = torch.Generator().manual_seed(seed + 300)
    for k in range(1, steps + 1):
        for p in params.values():
            p.grad = torch.randn(p.shape, generator=gen, dtype=dtype) * 0.1
        g_hat = {n: torch.randn(p.shape, generator=gen, dtype=dtype) for n, p in params.items()} \
            if rule.needs_loss and rule.refresh_due(k) else None
        opt.step(g_hat=g_hat)
    assert opt.paths == {"fused": steps}, opt.last_path  # one flat vector, torch's kernels
    state = {slot: _flat(opt.export_state(slot)) for slot in rule.slots}
    return _flat({n: p.detach() for n, p in params.items()}), state


def _run_reference(rule, trust: Trust, rho: float, correction: str, wd: float, lr: float,
                   seeds: list[int], steps: int, dtype: torch.dtype, lam: float = 1.0
                   ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The same clients stacked, through the reference."""
    x = torch.stack([_flat(_client(s, dtype)) for s in seeds])
    state = {slot: torch.zeros_like(x) for slot in rule.slots}
    for slot in rule.slots[1:]:
        state[slot] = torch.stack([_flat(_client(s + 100, dtype)).abs() * 1e-2 for s in seeds])
    if lam != 1.0:
        state["hessian"] = state["ref_hessian"] = torch.stack(
            [_flat(_client(s + 400, dtype)).abs() * 2e-2 for s in seeds])
    if rho:
        state["global_direction"] = torch.stack([_flat(_client(s + 200, dtype)) for s in seeds])
    gens = [torch.Generator().manual_seed(s + 300) for s in seeds]
    chain = Chain(lr=lr, weight_decay=wd, ref_lr=lr, rho=rho, correction=correction, trust=trust,
                  sizes=tuple(math.prod(s) for s in SHAPES.values()))
    for k in range(1, steps + 1):
        grads, hats = [], []
        for gen in gens:
            grads.append(torch.cat([torch.randn(s, generator=gen, dtype=dtype).reshape(-1) * 0.1
                                    for s in SHAPES.values()]))
            if rule.needs_loss and rule.refresh_due(k):
                hats.append(torch.cat([torch.randn(s, generator=gen, dtype=dtype).reshape(-1)
                                       for s in SHAPES.values()]))
        x, state, _ = elementwise_step(rule, x, torch.stack(grads), state, Step(k, 20 + k, lam), chain)
        if hats:
            state = refresh_hessian(rule, state, torch.stack(hats))
    return x, state


@pytest.mark.parametrize("path", ["eager", "fused"])
@pytest.mark.parametrize("case", list(CASES))
def test_every_path_is_the_reference_in_float64(case: str, path: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fused_adam, "EAGER", path == "eager")
    monkeypatch.setattr(native, "ENABLED", False)
    rule, trust, rho, correction, wd = CASES[case]
    seeds = [1, 2, 3]
    lam = LAMBDA.get(case, 1.0)
    x, state = _run_reference(rule, trust, rho, correction, wd, 0.05, seeds, 4, torch.float64, lam)
    for i, seed in enumerate(seeds):
        alone, alone_state = _run_alone(rule, trust, rho, correction, wd, 0.05, seed, 4,
                                        torch.float64, lam)
        torch.testing.assert_close(x[i], alone, rtol=1e-12, atol=1e-14)
        for slot, t in alone_state.items():
            torch.testing.assert_close(state[slot][i], t, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("path", ["eager", "fused"])
@pytest.mark.parametrize("case", list(CASES))
def test_every_path_is_the_reference_in_float32(case: str, path: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The same in float32 (torch's fused kernel or its eager passes, the radix / band top-k),
    against the reference run in float32 too: equal to the rounding of 4 steps (a few hundred
    ulps; Sophia's clipped ratio and SGD's plain steps much less), where the trust rule's
    choice is the same. A
    coordinate whose score lies within float32 rounding of the top-k threshold (or of 0, for
    the cautious mask) may take the other factor: at most one a step here."""
    monkeypatch.setattr(fused_adam, "EAGER", path == "eager")
    monkeypatch.setattr(native, "ENABLED", False)
    rule, trust, rho, correction, wd = CASES[case]
    seeds = [1, 2]
    lam = LAMBDA.get(case, 1.0)
    x, state = _run_reference(rule, trust, rho, correction, wd, 0.05, seeds, 4, torch.float32, lam)
    rtol = 500 * torch.finfo(torch.float32).eps
    for i, seed in enumerate(seeds):
        alone, alone_state = _run_alone(rule, trust, rho, correction, wd, 0.05, seed, 4, torch.float32, lam)
        far = ~torch.isclose(x[i], alone, rtol=rtol, atol=1e-6)
        assert int(far.sum()) <= (4 if trust.active else 0), f"{int(far.sum())} coordinates differ"
        for slot, t in alone_state.items():  # the moments do not depend on the trust factors
            torch.testing.assert_close(state[slot][i], t, rtol=rtol, atol=1e-7)


def test_the_native_loops_are_the_reference_over_several_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    """FedACT in the native form (the prepared step from the second step on) over 6 steps in
    float32 against the reference in float64 from the same inputs: m and v to float32
    rounding; x wherever no step put the coordinate's score within float32 rounding of the
    threshold (such a coordinate may take the other factor, and keeps that difference)."""
    lib = native.library()
    if lib is None or lib.adam is None:
        pytest.skip("no native form of FedACT's step here (no C compiler, or no form of torch's AdamW "
                    "kernel matched): the fused path is tested above")
    gen = torch.Generator().manual_seed(12)
    shapes = {"w": (300, 250), "b": (250,)}
    n = 75_250
    x0 = {k: torch.randn(s, generator=gen) for k, s in shapes.items()}
    dg0 = {k: torch.randn(s, generator=gen) * 1e-2 for k, s in shapes.items()}
    grads = [{k: torch.randn(s, generator=gen) * 0.1 for k, s in shapes.items()} for _ in range(6)]
    params = {k: torch.nn.Parameter(t.clone()) for k, t in x0.items()}
    opt = LocalUpdate(params.items(), lr=1e-3, weight_decay=0.01, preconditioner="adamw",
                      trust="act", tau=0.3, rho=0.5, step_offset=50, parameters_as_bucket_view=True)
    opt.set_global_direction(dg0)
    x = _flat(x0).double()[None]
    zeros = torch.zeros(1, n, dtype=torch.float64)
    state = {"exp_avg": zeros, "exp_avg_sq": zeros, "global_direction": _flat(dg0).double()[None]}
    chain = Chain(lr=1e-3, weight_decay=0.01, ref_lr=1e-3, rho=0.5, trust=ACT(tau=0.3))
    near = torch.zeros(n, dtype=torch.bool)
    for k, g in enumerate(grads, start=1):
        for name, p in params.items():
            p.grad = g[name].clone()
        opt.step()
        x, state, scores = elementwise_step(AdamW(), x, _flat(g).double()[None], state, Step(k, 50 + k),
                                            chain)
        threshold = scores[0].kthvalue(n - math.floor(0.3 * n) + 1).values
        near |= (scores[0] - threshold).abs() <= 1e-5 * threshold.abs() + 1e-12
    assert opt.paths == {"native": 6}, f"the native loops did not take every step: {opt.paths}"
    got = _flat({k: p.detach() for k, p in params.items()}).double()
    torch.testing.assert_close(got[~near], x[0][~near], rtol=2e-6, atol=1e-7)
    assert int(near.sum()) < 300
    for slot in ("exp_avg", "exp_avg_sq"):  # float32 rounding of terms (1-β)·g ~ 1e-2 (m), 1e-5 (v)
        torch.testing.assert_close(_flat(opt.export_state(slot)).double(), state[slot][0], rtol=2e-6,
                                   atol=6 * torch.finfo(torch.float32).eps * 1e-2)


def test_the_native_loops_are_the_reference_in_float32(monkeypatch: pytest.MonkeyPatch) -> None:
    """FedACT on a vector long enough for the native loops (where a compiler exists) against
    the reference in float64 from the same float32 inputs: one step; a coordinate whose score
    is within float32 rounding of the threshold may fall on either side."""
    if native.library() is None:
        pytest.skip("no C compiler here: the native loops do not run (the fused path is tested above)")
    gen = torch.Generator().manual_seed(11)
    shapes = {"w": (300, 250), "b": (250,)}
    x0 = {n: torch.randn(s, generator=gen) for n, s in shapes.items()}
    g0 = {n: torch.randn(s, generator=gen) * 0.1 for n, s in shapes.items()}
    v0 = {n: torch.rand(s, generator=gen) * 1e-2 for n, s in shapes.items()}
    dg0 = {n: torch.randn(s, generator=gen) * 1e-2 for n, s in shapes.items()}
    params = {n: torch.nn.Parameter(t.clone()) for n, t in x0.items()}
    opt = LocalUpdate(params.items(), lr=1e-3, weight_decay=0.01, preconditioner="adamw",
                      trust="act", tau=0.5, rho=0.5, step_offset=50, parameters_as_bucket_view=True)
    opt.import_state("exp_avg_sq", v0)
    opt.set_global_direction(dg0)
    for n, p in params.items():
        p.grad = g0[n].clone()
    opt.step()
    assert opt.paths == {"native": 1}, f"the native loops did not take the step: {opt.last_path}"
    state = {"exp_avg": torch.zeros(1, 75_250, dtype=torch.float64),
             "exp_avg_sq": _flat(v0).double()[None], "global_direction": _flat(dg0).double()[None]}
    chain = Chain(lr=1e-3, weight_decay=0.01, ref_lr=1e-3, rho=0.5, trust=ACT(tau=0.5))
    want, _, scores = elementwise_step(AdamW(), _flat(x0).double()[None], _flat(g0).double()[None],
                                       state, Step(1, 51), chain)
    got = _flat({n: p.detach() for n, p in params.items()}).double()
    threshold = scores[0].kthvalue(75_250 - 37_625 + 1).values
    near = (scores[0] - threshold).abs() <= 1e-5 * threshold.abs() + 1e-12
    torch.testing.assert_close(got[~near], want[0][~near], rtol=2e-6, atol=1e-7)
    assert int(near.sum()) < 50


def test_rows_diagnostics_are_each_rows_pos_ratio_and_top_mass() -> None:
    """The cohort's PosRatio/TopMass of C rows at once against trust.py's one-vector functions,
    ties and an all-negative row included."""
    from adaptfl.local_update.trust import pos_ratio, rows_diagnostics, top_mass

    gen = torch.Generator().manual_seed(5)
    scores = torch.randn(4, 3000, generator=gen, dtype=torch.float64)
    scores[1] = torch.randint(-3, 4, (3000,), generator=gen).double()
    scores[2] = -scores[2].abs()
    got = rows_diagnostics(scores)
    for i, row in enumerate(scores):
        assert float(got["pos-ratio"][i]) == pytest.approx(float(pos_ratio(row)), rel=1e-12)
        assert float(got["top-mass"][i]) == pytest.approx(float(top_mass(row)), rel=1e-9, abs=1e-12)
