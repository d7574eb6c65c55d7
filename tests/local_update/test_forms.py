"""Every form of the local step against the readable reference (local_update/step/), and the
form each algorithm's steps take, asserted, so that a fast form that silently stops applying
fails here.

- The per-tensor rules (Muon, SOAP) through `LocalUpdate` against `step/tensors.py` over
  several steps in float64: FedPAC's correction after their own step (seed 001), FedACT's chain
  with a trust rule over their directions, alignment (a warm start) and basis refreshes included.
- FedMIX-P's mixed statistic, as SOAP and Sophia form it, against `tensors.mixed`.
- Every algorithm of the catalog, its client's optimizer built as the ClientApp builds it: the
  form `choose_path` picks is the one its components call for (native for FedACT's global trust
  where the loops build, fused for the other elementwise rules, eager for the per-tensor ones
  and several param groups), a diagnostics step included.
The elementwise rules' fused and eager passes against `step/reference.py` and the native loops
against the fused form bit for bit are in test_reference.py and test_native_trust_step.py.
"""

from __future__ import annotations

import pytest
import torch

from adaptfl.algorithms.catalog import catalog
from adaptfl.algorithms.config import RunConfig
from adaptfl.client_app.session import build_optimizer
from adaptfl.local_update import LocalUpdate, native
from adaptfl.local_update.modulation import ACT, NoTrust, Trust
from adaptfl.local_update.rules import Step
from adaptfl.local_update.rules.soap import SOAP
from adaptfl.local_update.rules.sophia import sophia_direction
from adaptfl.local_update.step.choose import Path, choose_path
from adaptfl.local_update.step.local_step import local_step
from adaptfl.local_update.step.reference import Chain
from adaptfl.local_update.step.tensors import mixed, tensor_step

SHAPES = {"w0": (7, 5), "w1": (4, 7), "c": (3, 2, 2, 2)}  # matrices and a conv weight (SOAP's modes)
LR, WD = 0.02, 0.05

CASES = {  # name: (preconditioner, its options, trust, rho, correction)
    "fedpac-soap": ("soap", {"precondition_frequency": 2}, NoTrust(), 0.5, "after-step"),
    "fedpac-muon": ("muon", {"muon_routing": "all-2d"}, NoTrust(), 0.5, "after-step"),
    "local-soap": ("soap", {"precondition_frequency": 3}, NoTrust(), 0.0, "mix"),
    "soap-act": ("soap", {"precondition_frequency": 2}, ACT(tau=0.4), 0.5, "mix"),
    "muon-act-per-tensor": ("muon", {"muon_routing": "all-2d"}, ACT(tau=0.4, trust_scope="per-tensor"),
                            0.3, "mix"),
}


def _choose(opt: LocalUpdate) -> Path:
    """choose_path as `opt.step` asks it: the first group's rule and parameters with a gradient."""
    group = opt.param_groups[0]
    return choose_path(opt, opt.rule(group), [p for p in group["params"] if p.grad is not None])


def _tensors(seed: int, matrices: bool = False) -> dict[str, torch.Tensor]:
    """The client's tensors (`matrices`: the 2-D ones only, all of which Muon takes)."""
    gen = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s, generator=gen, dtype=torch.float64) for n, s in SHAPES.items()
            if not matrices or len(s) == 2}


def _optimizer(case: str, params: dict[str, torch.nn.Parameter]) -> LocalUpdate:
    rule, options, trust, rho, correction = CASES[case]
    return LocalUpdate(params.items(), lr=LR, weight_decay=WD, preconditioner=rule, trust=trust,
                       rho=rho, correction=correction, parameters_as_bucket_view=True, **options)


@pytest.mark.parametrize("warm", [False, True])
@pytest.mark.parametrize("case", list(CASES))
def test_the_per_tensor_rules_are_their_reference(case: str, warm: bool) -> None:
    muon = CASES[case][0] == "muon"
    params = {n: torch.nn.Parameter(t) for n, t in _tensors(0, muon).items()}
    opt = _optimizer(case, params)
    rule = opt.rule(opt.param_groups[0])
    if warm and isinstance(rule, SOAP):  # FedPAC's alignment: averaged statistics warm-start Q
        opt.import_theta({f"{n}/{slot}": (t @ t.mT if t.ndim == 2 else None)
                          for n, t in _tensors(7).items() for slot in ("gg0",) if t.ndim == 2})
    elif warm:
        pytest.skip("a warm start is SOAP's alignment (Muon's Θ is its momentum: below)")
    dg = _tensors(1, muon)
    if CASES[case][3]:
        opt.set_global_direction(dg)
    names = list(params)
    xs = [params[n].detach().clone() for n in names]
    states = [{k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in opt.state[params[n]].items()}
              for n in names]
    chain = Chain(lr=LR, weight_decay=WD, ref_lr=LR, rho=CASES[case][3], correction=CASES[case][4],
                  trust=CASES[case][2], sizes=tuple(t.numel() for t in xs))
    gen = torch.Generator().manual_seed(2)
    for k in range(1, 7):
        grads = [torch.randn(x.shape, generator=gen, dtype=torch.float64) for x in xs]
        for n, g in zip(names, grads, strict=True):
            params[n].grad = g.clone()
        opt.step()
        for st in states:
            st["step"] = k
        xs, states = tensor_step(rule, xs, grads, states, Step(k, k), chain,
                                 [dg[n] for n in names] if CASES[case][3] else None)
        for n, x in zip(names, xs, strict=True):
            torch.testing.assert_close(params[n].detach(), x, rtol=1e-10, atol=1e-12, msg=f"{n}, step {k}")
    assert opt.paths == {"eager": 6}, opt.paths  # per-tensor rules: one block per tensor


def test_a_reference_that_ignores_the_correction_fails() -> None:
    """The per-tensor reference reads ρ·L·Δ_G: without it FedPAC's steps differ (so the test
    above can see a correction that went missing)."""
    params = {n: torch.nn.Parameter(t) for n, t in _tensors(0, True).items()}
    opt = _optimizer("fedpac-muon", params)
    opt.set_global_direction(_tensors(1, True))
    names = list(params)
    xs = [params[n].detach().clone() for n in names]
    states = [dict(opt.state[params[n]]) for n in names]
    grads = [torch.randn(x.shape, dtype=torch.float64) for x in xs]
    for n, g in zip(names, grads, strict=True):
        params[n].grad = g.clone()
    opt.step()
    chain = Chain(lr=LR, weight_decay=WD, ref_lr=LR, rho=0.5, correction="after-step")
    plain, _ = tensor_step(opt.rule(opt.param_groups[0]), xs, grads, states, Step(1, 1), chain, None)
    assert not torch.allclose(params[names[0]].detach(), plain[0])


def test_fedmixp_mixes_as_the_reference_writes_it() -> None:
    """H = (1-λ)·P^r + λ·P_i (seed 002): SOAP's statistic and Sophia's Hessian, to round-off."""
    gen = torch.Generator().manual_seed(4)
    ref, own = torch.rand(6, 6, generator=gen, dtype=torch.float64), torch.rand(6, 6, generator=gen,
                                                                                 dtype=torch.float64)
    for lam in (0.0, 0.3, 1.0):
        st = {"ref_gg0": ref, "gg0": own}
        torch.testing.assert_close(SOAP._mixed(st, [own], lam)[0], mixed(ref, own, lam), rtol=1e-14, atol=0)
        m, g = torch.zeros(6, 6, dtype=torch.float64), torch.randn(6, 6, generator=gen, dtype=torch.float64)
        got = sophia_direction(g, m.clone(), own, 0.9, 0.04, 8, ref, lam)
        want = sophia_direction(g, m.clone(), mixed(ref, own, lam), 0.9, 0.04, 8)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=0)


# --- the form every algorithm's steps take ------------------------------------------------

def _expected_form(trust: Trust, elementwise: bool, groups: int) -> str:
    """From the algorithm's declared components alone: what choose_path must pick."""
    if not elementwise or groups != 1:
        return "eager"
    if type(trust) is ACT and not trust.per_tensor and native.library() is not None:
        return "native"
    return "fused"


@pytest.mark.parametrize("name", sorted(catalog()))
def test_every_algorithm_takes_the_form_its_components_call_for(name: str) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(200, 100), torch.nn.ReLU(), torch.nn.Linear(100, 10))
    cfg = RunConfig.of(algorithm=name)
    opt = build_optimizer(model, cfg.algorithm, cfg.round_info(1))
    model(torch.randn(16, 200)).logsumexp(1).sum().backward()
    rule = opt.rule(opt.param_groups[0])
    want = _expected_form(opt.trust, rule.elementwise, len(opt.param_groups))
    path = _choose(opt)
    assert path.form == want, (path, want)
    opt.step()  # the first step records PosRatio/TopMass where the algorithm measures them
    assert opt.last_path is not None and opt.last_path.form == want, opt.last_path


def _fedact32(seed: int) -> tuple[LocalUpdate, dict[str, torch.nn.Parameter]]:
    gen = torch.Generator().manual_seed(seed)
    params = {n: torch.nn.Parameter(torch.randn(s, generator=gen)) for n, s in
              {"w": (120, 200), "b": (200,)}.items()}
    opt = LocalUpdate(params.items(), lr=1e-2, weight_decay=0.01, preconditioner="adamw", trust="act",
                      tau=0.3, rho=0.5, parameters_as_bucket_view=True)
    opt.set_global_direction({n: 1e-3 * torch.randn(p.shape, generator=gen) for n, p in params.items()})
    return opt, params


def test_the_forms_forced_through_the_door_agree_bit_for_bit() -> None:
    """`local_step(opt, path=...)` runs the form it is given: FedACT forced into the fused form
    ends on the native form's bits, step after step (the native loops reproduce torch's kernel
    and the band's selection exactly)."""
    if native.library() is None:
        pytest.skip("no C compiler here: the native form does not exist to compare")
    runs = []
    for form in ("native", "fused"):
        opt, params = _fedact32(4)
        gen = torch.Generator().manual_seed(9)
        xs = []
        for _ in range(6):
            for p in params.values():
                p.grad = torch.randn(p.shape, generator=gen)
            chosen = _choose(opt)
            assert chosen.form == "native", chosen.reason
            forced = None if form == "native" else Path("fused", "forced", chosen.grads_stay,
                                                          chosen.fuse_correction)
            with torch.no_grad():
                local_step(opt, path=forced)
            xs.append(torch.cat([p.detach().reshape(-1) for p in params.values()]))
        assert opt.paths == {form: 6}
        runs.append(xs)
    for k, (a, b) in enumerate(zip(*runs, strict=True)):
        assert torch.equal(a, b), f"step {k + 1}"


def test_a_forced_form_that_does_not_apply_is_refused() -> None:
    params = {"w": torch.nn.Parameter(torch.randn(50, 40, dtype=torch.float64))}
    opt = LocalUpdate(params.items(), lr=1e-2, preconditioner="adamw", trust="act", tau=0.3,
                      parameters_as_bucket_view=True)
    params["w"].grad = torch.randn(50, 40, dtype=torch.float64)
    with pytest.raises(ValueError, match="the native form cannot take this step: "):
        local_step(opt, path=Path("native", "forced"))
    assert opt.steps == 0 and opt.state[params["w"]]["step"] == 0  # nothing taken
