"""One parametrised suite over every preconditioner of the one LocalUpdate shell (sgd, adam,
adamw, sophia, muon, soap, with correction, trust modulation and mixing), torch's optimizer
conventions, and oracles no one here wrote:

  AdamW / Adam / SGD   torch.optim's own.
  Muon   `torch.optim.Muon` on the Muon-routed matrices + `torch.optim.AdamW` on the rest (the
         parameter split is ours, local_update/routing.py; the oracle gets the same split).
  SOAP   `pytorch_optimizer.SOAP` 4.1.0 (first step only initialises, ε before the bias
         correction, decay after the step, QR refresh every f steps with v re-sorted).
  Sophia `sophia_opt.SophiaG` 0.2.2. Named differences: (1) the authors' loop refreshes h after
         the step with a NEW forward at the updated weights; ours reuses the step's own forward
         and refreshes after local steps 1, 1+k_h, … — the test feeds the oracle our ĝ on our
         schedule via `update_hessian()`. (2) the denominator is max(ρ·bs·h, 1e-15) where the
         authors add 1e-15; identical unless ρ·bs·h < 1e-13.
FedPAC's correction is checked against the same oracles run at lr·(1-β), followed by
x -= β·lr·g_G by hand (spec §3).
"""

from __future__ import annotations

import copy
import io

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from adaptfl.local_update import LocalUpdate
from adaptfl.local_update.rules.sophia import gnb_loss

VARIANTS: dict[str, dict] = {
    "sgd": dict(preconditioner="sgd", lr=0.3),
    "adam": dict(preconditioner="adam", lr=0.05, weight_decay=1e-3),
    "adamw": dict(preconditioner="adamw", lr=0.05, weight_decay=1e-2),
    "adamw-act": dict(preconditioner="adamw", lr=0.05, trust="act", tau=0.5, alpha=2.0, gamma=0.5),
    "adamw-act-per-tensor": dict(preconditioner="adamw", lr=0.05, trust="act", trust_scope="per-tensor"),
    "adamw-act-hard-mask": dict(preconditioner="adamw", lr=0.05, trust="act", gamma=0.0),
    "adamw-cautious": dict(preconditioner="adamw", lr=0.05, trust="cautious"),
    "adamw-mgup": dict(preconditioner="adamw", lr=0.05, trust="mgup"),
    "adamw-corrected-act": dict(preconditioner="adamw", lr=0.05, rho=0.5, trust="act", step_offset=7,
                                bias_correction="paper"),
    "sophia": dict(preconditioner="sophia", lr=0.01, sophia_beta1=0.9, sophia_beta2=0.99,
                   hessian_interval=2),
    "sophia-corrected-mixed": dict(preconditioner="sophia", lr=0.01, rho=0.3, mix_lambda=0.5),
    "muon": dict(preconditioner="muon", lr=0.02, muon_momentum=0.9, muon_adam_lr=0.01,
                 muon_routing="all-2d"),
    "muon-trust-opt-in": dict(preconditioner="muon", lr=0.02, trust="cautious", trust_on_muon=True,
                              muon_routing="all-2d"),
    "soap": dict(preconditioner="soap", lr=0.02, precondition_frequency=3),
    "soap-small-dim": dict(preconditioner="soap", lr=0.02, precondition_frequency=2, max_precond_dim=5),
    "soap-act": dict(preconditioner="soap", lr=0.02, trust="act"),
    "soap-fedpac": dict(preconditioner="soap", lr=0.02, rho=0.5, correction="after-step"),
}
SHARED = ("sophia", "muon", "soap")  # rules with a Θ to export


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 12), nn.Tanh(), nn.Linear(12, 4))


def _cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(2, 6, 3), nn.Tanh(), nn.Flatten(), nn.Linear(6 * 4 * 4, 5))


def _model(name: str) -> nn.Module:
    return _cnn() if name.startswith("soap") else _mlp()


def _data(model: nn.Module, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 + step)
    conv = isinstance(model[0], nn.Conv2d)
    x = torch.randn((16, 2, 6, 6) if conv else (16, 8), generator=gen)
    return x, torch.randint(0, 5 if conv else 4, (16,), generator=gen)


def _opt(name: str, model: nn.Module, **extra) -> LocalUpdate:
    kw = {**VARIANTS[name], **extra}
    opt = LocalUpdate(model.named_parameters(), **kw)
    if kw.get("rho"):
        gen = torch.Generator().manual_seed(1)
        opt.set_global_direction({n: 0.01 * torch.randn(p.shape, generator=gen)
                                  for n, p in model.named_parameters()})
    return opt


def _train(model: nn.Module, opt: LocalUpdate, steps: int, start: int = 0) -> list[float]:
    losses, params = [], dict(model.named_parameters())
    for k in range(start, start + steps):
        x, y = _data(model, k)
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        g_hat = None
        opt.bs = y.numel()
        if opt.hessian_due():
            gen = torch.Generator().manual_seed(k)
            grads = torch.autograd.grad(gnb_loss(logits, F.cross_entropy, gen), list(params.values()),
                                        retain_graph=True)
            g_hat = dict(zip(params, grads, strict=True))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step(g_hat=g_hat)
        losses.append(float(loss.detach()))
    return losses


def _max_diff(a: nn.Module, b: nn.Module) -> float:
    return max(float((p.detach() - q.detach()).abs().max())
               for p, q in zip(a.parameters(), b.parameters(), strict=True))


# --- the parametrised suite -------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_loss_decreases_on_a_fixed_batch(name: str) -> None:
    model = _model(name)
    opt = _opt(name, model)
    if VARIANTS[name].get("mix_lambda", 1.0) < 1.0:  # a reference Θ^r: h of a first client run
        first = copy.deepcopy(model)
        o = LocalUpdate(first.named_parameters(), preconditioner="sophia", lr=0.01)
        _train(first, o, 4)
        opt.import_theta(o.export_theta(), keep_reference=True)
    x, y = _data(model, 0)
    before = float(F.cross_entropy(model(x), y))
    for _ in range(30):
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()
    assert float(F.cross_entropy(model(x), y)) < 0.8 * before


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_none_grad_changes_nothing(name: str) -> None:
    model = _model(name)
    opt = _opt(name, model)
    _train(model, opt, 3)
    frozen = model[0].weight
    before = frozen.detach().clone()
    state_before = {k: v.clone() for k, v in opt.state[frozen].items() if torch.is_tensor(v)}
    x, y = _data(model, 9)
    opt.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()
    frozen.grad = None
    opt.step()
    assert torch.equal(frozen.detach(), before)
    for k, v in state_before.items():
        assert torch.equal(opt.state[frozen][k], v), k


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_state_dict_round_trip_gives_the_identical_next_steps(name: str) -> None:
    """torch's way: save the optimizer, build a fresh one the same way, load, continue."""
    model = _model(name)
    opt = _opt(name, model)
    _train(model, opt, 4)
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)
    twin = copy.deepcopy(model)
    opt_twin = LocalUpdate(twin.named_parameters(), **VARIANTS[name])
    opt_twin.load_state_dict(torch.load(io.BytesIO(buffer.getvalue()), weights_only=True))
    _train(model, opt, 3, start=4)
    _train(twin, opt_twin, 3, start=4)
    assert _max_diff(model, twin) == 0.0
    if name != "sgd":  # and the state mattered: without it the steps differ
        fresh = copy.deepcopy(twin)
        _train(fresh, LocalUpdate(fresh.named_parameters(), **VARIANTS[name]), 3, start=7)
        _train(twin, opt_twin, 3, start=7)
        assert _max_diff(fresh, twin) > 0.0


@pytest.mark.parametrize("name", SHARED)
def test_theta_export_import_gives_the_identical_next_steps(name: str) -> None:
    """A client warm-started from an exported Θ steps exactly like one loaded with the same Θ."""
    model = _model(name)
    opt = _opt(name, model)
    _train(model, opt, 4)
    theta = opt.export_theta()
    assert theta and all(v.dtype == torch.float32 for v in theta.values())
    a, b = copy.deepcopy(model), copy.deepcopy(model)
    opt_a, opt_b = _opt(name, a), _opt(name, b)
    opt_a.import_theta(theta)
    opt_b.import_theta({k: v.clone() for k, v in theta.items()})
    _train(a, opt_a, 3, start=4)
    _train(b, opt_b, 3, start=4)
    assert _max_diff(a, b) == 0.0
    c = copy.deepcopy(model)
    _train(c, _opt(name, c), 3, start=4)
    assert _max_diff(a, c) > 0.0  # Θ mattered


def test_v_export_import_by_name_warm_starts_adamw() -> None:
    model = _mlp()
    opt = _opt("adamw", model)
    _train(model, opt, 3)
    v = opt.export_state("exp_avg_sq")
    assert set(v) == {n for n, _ in model.named_parameters()}
    a = copy.deepcopy(model)
    opt_a = _opt("adamw", a)
    opt_a.import_state("exp_avg_sq", v)
    assert all(torch.equal(opt_a.state[p]["exp_avg_sq"], v[n]) for n, p in a.named_parameters())
    with pytest.raises(ValueError, match="shape"):
        opt_a.import_state("exp_avg_sq", {"0.weight": torch.zeros(3)})


# --- torch's conventions -------------------------------------------------------------------------
def test_plain_parameters_and_lr_keyword_give_torch_adamw() -> None:
    ours, theirs = _mlp(), _mlp()
    opt = LocalUpdate(ours.parameters(), lr=1e-3)
    oracle = torch.optim.AdamW(theirs.parameters(), lr=1e-3)
    for k in range(10):
        x, y = _data(ours, k)
        for model, o in ((ours, opt), (theirs, oracle)):
            o.zero_grad()
            F.cross_entropy(model(x), y).backward()
            o.step()
    assert _max_diff(ours, theirs) < 1e-6 and _max_diff(ours, _mlp()) > 1e-3


def test_an_lr_scheduler_drives_the_step() -> None:
    """CosineAnnealingLR changes param_groups' lr, and the step uses it: the same as setting the
    lr by hand every step, and not the same as a constant lr."""
    name = "adamw-corrected-act"
    scheduled = _mlp()
    opt = _opt(name, scheduled)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=6)
    lrs = []
    for k in range(6):
        lrs.append(opt.param_groups[0]["lr"])
        _train(scheduled, opt, 1, start=k)
        sched.step()
    assert lrs[0] > lrs[-1]
    by_hand = _mlp()
    opt = _opt(name, by_hand)
    for k, lr in enumerate(lrs):
        opt.param_groups[0]["lr"] = lr
        _train(by_hand, opt, 1, start=k)
    constant = _mlp()
    _train(constant, _opt(name, constant), 6)
    assert _max_diff(scheduled, by_hand) == 0.0
    assert _max_diff(scheduled, constant) > 1e-4


def test_zero_grad_and_the_papers_trust_defaults() -> None:
    model = _mlp()
    opt = LocalUpdate(model.parameters(), lr=0.01, trust="act", tau=0.3)
    assert (opt.trust.trust_alpha, opt.trust.trust_gamma) == pytest.approx((1 / 0.3, 0.3))
    F.cross_entropy(model(_data(model, 0)[0]), _data(model, 0)[1]).backward()
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("bad,match", [
    (dict(lr=-1.0), "lr"), (dict(beta1=1.0), "beta1"), (dict(trust="act", tau=0.0), "tau"),
    (dict(rho=1.5), "rho"), (dict(preconditioner="shampoo"), "shampoo"), (dict(trust="bogus"), "bogus"),
    (dict(trust="act", alpha=0.5, gamma=1.0), "gamma"), (dict(correction="later"), "correction"),
])
def test_bad_hyperparameters_raise_naming_them(bad: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        LocalUpdate(_mlp().parameters(), **bad)


def test_an_unknown_keyword_is_a_type_error_naming_it() -> None:
    with pytest.raises(TypeError, match="momentum"):
        LocalUpdate(_mlp().parameters(), lr=0.1, momentum=0.9)


def test_trust_on_muon_needs_an_explicit_opt_in() -> None:
    from adaptfl.algorithms.config import RunConfig

    with pytest.raises(ValueError, match="trust-on-muon"):
        RunConfig.of(algorithm="local-muon", trust="act")
    RunConfig.of(algorithm="local-muon", trust="act", trust_on_muon=True)  # opted in: allowed


def test_import_rejects_wrong_shapes_and_names() -> None:
    model = _mlp()
    opt = _opt("sophia", model)
    with pytest.raises(ValueError, match="shape"):
        opt.import_theta({"0.weight/hessian": torch.zeros(3, 3)})
    with pytest.raises(ValueError, match="lacks"):
        opt.import_theta({"9.weight/hessian": torch.zeros(3, 3)})


# --- oracles -------------------------------------------------------------------------------------
def _oracle_steps(ours: nn.Module, opt: LocalUpdate, theirs: nn.Module, oracles: list, steps: int,
                  after=None) -> None:
    for k in range(steps):
        x, y = _data(ours, k)
        for model, opts in ((ours, [opt]), (theirs, oracles)):
            for o in opts:
                o.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            for o in opts:
                o.step()
        if after is not None:
            after()


@pytest.mark.parametrize("name,torch_cls,kw", [
    ("adamw", torch.optim.AdamW, dict(lr=0.05, weight_decay=1e-2)),
    ("adam", torch.optim.Adam, dict(lr=0.05, weight_decay=1e-3)),
    ("sgd", torch.optim.SGD, dict(lr=0.02, weight_decay=1e-3)),
])
def test_reproduces_torch_over_20_steps(name: str, torch_cls: type, kw: dict) -> None:
    ours, theirs = _mlp(), _mlp()
    opt = LocalUpdate(ours.named_parameters(), preconditioner=name, bias_correction="local", **kw) \
        if name != "sgd" else LocalUpdate(ours.named_parameters(), preconditioner="sgd", **kw)
    _oracle_steps(ours, opt, theirs, [torch_cls(theirs.parameters(), **kw)], 20)
    assert _max_diff(ours, theirs) < 1e-6 and _max_diff(ours, _mlp()) > 1e-3


def test_a_parameter_without_grad_keeps_its_own_step_count_as_torch() -> None:
    """torch counts steps per parameter: a parameter skipped on some steps gets its own bias
    correction (issue: one shared counter drifted by 6.5e-3 after 12 steps)."""
    ours, theirs = _mlp(), _mlp()
    opt = LocalUpdate(ours.named_parameters(), lr=0.05, bias_correction="local")
    oracle = torch.optim.AdamW(theirs.parameters(), lr=0.05)
    for k in range(12):
        x, y = _data(ours, k)
        for model, o in ((ours, opt), (theirs, oracle)):
            o.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            if k % 3 == 0:
                model[0].bias.grad = None
            o.step()
    assert _max_diff(ours, theirs) < 1e-6


def _muon_oracle(model: nn.Module, lr: float, adam_lr: float) -> list:
    named = dict(model.named_parameters())
    return [torch.optim.Muon([named["2.weight"]], lr=lr, weight_decay=0.01, momentum=0.95),
            torch.optim.AdamW([p for n, p in named.items() if n != "2.weight"], lr=adam_lr,
                              betas=(0.9, 0.95), eps=1e-10, weight_decay=0.01)]


# bf16 Newton-Schulz (ours and torch's alike) turns a last-bit difference of its float32 input
# into up to about one bf16 ulp of O (nextafter of every entry of 200 random matrices moved O by
# 1.25·eps_bf16 at most), and later steps feed that back through the gradients. So two runs that
# round one float32 or bf16 operation differently (bf16 GEMMs that accumulate in another order:
# AMX tiles, GPUs, a batched baddbmm against a per-matrix addmm; a fused pass against an eager
# one) drift apart by ~1e-3 within 20 steps (4e-3 on an AVX-512-BF16/AMX Xeon, 0 on this AMD
# EPYC); a 20-step trajectory cannot be compared at float32 tolerance on every machine. Each
# step is compared from the same state instead: the oracle takes our parameters and momentum
# buffers, both take one step, and they must agree to float32 rounding on every float32 entry
# (the AdamW half) and to lr·scale·2·eps_bf16 on the Muon matrices (two bf16 ulps of O, whose
# entries are below ~1.5 as its singular values are).
MUON_TOLERANCE = 2 * torch.finfo(torch.bfloat16).eps


def _muon_synced_steps(ours: nn.Module, opt: LocalUpdate, theirs: nn.Module, oracles: list,
                       steps: int, after=None) -> None:
    """`steps` oracle comparisons, each from our state (see MUON_TOLERANCE); oracles[0] is
    torch's Muon over the matrices of our first param group."""
    from adaptfl.local_update.rules.muon import shape_scale

    mine, other = dict(ours.named_parameters()), dict(theirs.named_parameters())
    muon = set(opt.param_groups[0]["param_names"])
    for k in range(steps):
        with torch.no_grad():
            for n, p in mine.items():
                other[n].copy_(p)
                state = oracles[0].state.get(other[n])
                if n in muon and state:
                    state["momentum_buffer"].copy_(opt.state[p]["momentum_buffer"])
        x, y = _data(ours, k)
        for model, opts in ((ours, [opt]), (theirs, oracles)):
            for o in opts:
                o.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            for o in opts:
                o.step()
        if after is not None:
            after()
        for n, p in mine.items():
            bound = oracles[0].param_groups[0]["lr"] * shape_scale(p.shape) * MUON_TOLERANCE \
                if n in muon else 1e-6
            diff = float((p.detach() - other[n].detach()).abs().max())
            assert diff <= bound, f"step {k + 1}, {n}: {diff:.3g} > {bound:.3g}"


def test_muon_reproduces_torch_muon_and_adamw_over_20_steps() -> None:
    ours, theirs = _mlp(), _mlp()
    opt = LocalUpdate(ours.named_parameters(), preconditioner="muon", lr=0.02, muon_momentum=0.95,
                      weight_decay=0.01, muon_adam_lr=3e-4)
    assert [g["param_names"] for g in opt.param_groups][0] == ["2.weight"]  # the hidden matrix only
    _muon_synced_steps(ours, opt, theirs, _muon_oracle(theirs, 0.02, 3e-4), 20)
    assert _max_diff(ours, _mlp()) > 1e-2  # it moved: 20 steps of lr·|O| ~ 0.02 each


def test_muon_tolerance_tells_a_wrong_rule() -> None:
    """The per-step bound is tight enough to fail: torch's Muon without Nesterov (one of the
    things our rule could get wrong) is outside it on the first comparison that has momentum."""
    ours, theirs = _mlp(), _mlp()
    opt = LocalUpdate(ours.named_parameters(), preconditioner="muon", lr=0.02, muon_momentum=0.95,
                      weight_decay=0.01, muon_adam_lr=3e-4)
    oracles = _muon_oracle(theirs, 0.02, 3e-4)
    oracles[0].param_groups[0]["nesterov"] = False
    with pytest.raises(AssertionError, match="2.weight"):
        _muon_synced_steps(ours, opt, theirs, oracles, 3)


@pytest.mark.parametrize("max_dim", [10000, 5])  # 5: the head's 96 and the conv's 6 stay unrotated
def test_soap_reproduces_pytorch_optimizer_soap_over_25_steps(max_dim: int) -> None:
    soap_cls = pytest.importorskip("pytorch_optimizer").SOAP
    ours, theirs = _cnn(), _cnn()
    opt = LocalUpdate(ours.named_parameters(), preconditioner="soap", lr=3e-3, weight_decay=0.01,
                      precondition_frequency=4, max_precond_dim=max_dim)
    oracle = soap_cls(theirs.parameters(), lr=3e-3, betas=(0.95, 0.95), shampoo_beta=0.95,
                      weight_decay=0.01, precondition_frequency=4, max_precondition_dim=max_dim)
    _oracle_steps(ours, opt, theirs, [oracle], 25)
    assert _max_diff(ours, theirs) < 2e-6 and _max_diff(ours, _cnn()) > 1e-2
    conv = opt.state[ours[0].weight]
    assert [tuple(conv[f"gg{i}"].shape) if f"gg{i}" in conv else None for i in range(4)] == \
        ([(6, 6), (2, 2), (3, 3), (3, 3)] if max_dim > 6 else [None, (2, 2), (3, 3), (3, 3)])


def test_sophia_reproduces_the_authors_sophiag_over_20_steps() -> None:
    sophia_cls = pytest.importorskip("sophia_opt").SophiaG
    ours, theirs = _mlp(), _mlp()
    opt = LocalUpdate(ours.named_parameters(), preconditioner="sophia", lr=1e-3, sophia_beta1=0.965,
                      sophia_beta2=0.99, weight_decay=0.1, hessian_interval=3)
    oracle = sophia_cls(theirs.parameters(), lr=1e-3, betas=(0.965, 0.99), rho=0.04, weight_decay=0.1)
    refreshes = 0
    for k in range(20):
        x, y = _data(ours, k)
        due = opt.hessian_due()
        _train(ours, opt, 1, start=k)
        logits = theirs(x)
        if due:  # difference (1): same ĝ (same sampled labels), our schedule
            gen = torch.Generator().manual_seed(k)
            g_hat = torch.autograd.grad(gnb_loss(logits, F.cross_entropy, gen), list(theirs.parameters()),
                                        retain_graph=True)
        oracle.zero_grad(set_to_none=True)
        F.cross_entropy(logits, y).backward()
        oracle.step(bs=y.numel())
        if due:
            for p, g in zip(theirs.parameters(), g_hat, strict=True):
                p.grad = g
            oracle.update_hessian()
            refreshes += 1
    assert refreshes == 7  # after local steps 1, 4, 7, …, 19
    assert _max_diff(ours, theirs) < 1e-6
    assert float(opt.state[ours[0].weight]["hessian"].abs().sum()) > 0.0  # the refresh ran


# --- FedPAC's correction, by hand over the oracles (spec §3) --------------------------------------
BETA, LR = 0.5, 0.02


def _g_g(model: nn.Module) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    return {n: torch.randn(p.shape, generator=gen) for n, p in model.named_parameters()}


def _correct_by_hand(model: nn.Module, g_g: dict[str, torch.Tensor], lr: float):  # noqa: ANN202
    def after() -> None:
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.add_(g_g[n], alpha=-BETA * lr)  # x -= β·lr·g_G after the local step
    return after


def test_fedpac_soap_step_by_hand() -> None:
    soap_cls = pytest.importorskip("pytorch_optimizer").SOAP
    ours, theirs = _cnn(), _cnn()
    opt = LocalUpdate(ours.named_parameters(), preconditioner="soap", lr=LR, weight_decay=0.01,
                      precondition_frequency=4, rho=BETA, correction="after-step")
    g_g = _g_g(ours)
    opt.set_global_direction(g_g)
    oracle = soap_cls(theirs.parameters(), lr=(1 - BETA) * LR, betas=(0.95, 0.95), shampoo_beta=0.95,
                      weight_decay=0.01, precondition_frequency=4)
    # step 1 of a fresh SOAP only initialises, yet the correction applies to every parameter
    _oracle_steps(ours, opt, theirs, [oracle], 12, after=_correct_by_hand(theirs, g_g, LR))
    assert _max_diff(ours, theirs) < 1e-6 and _max_diff(ours, _cnn()) > 1e-2


def test_fedpac_muon_step_by_hand() -> None:
    ours, theirs = _mlp(), _mlp()
    opt = LocalUpdate(ours.named_parameters(), preconditioner="muon", lr=LR, muon_momentum=0.95,
                      weight_decay=0.01, muon_adam_lr=3e-4, rho=BETA, correction="after-step")
    g_g = _g_g(ours)
    opt.set_global_direction(g_g)
    oracles = _muon_oracle(theirs, (1 - BETA) * LR, (1 - BETA) * 3e-4)
    # each step from the same state (MUON_TOLERANCE: bf16 Newton-Schulz amplifies last bits)
    _muon_synced_steps(ours, opt, theirs, oracles, 12, after=_correct_by_hand(theirs, g_g, LR))
    assert _max_diff(ours, _mlp()) > 1e-3


def test_fedpac_sophia_step_by_hand() -> None:
    sophia_cls = pytest.importorskip("sophia_opt").SophiaG
    ours, theirs = _mlp(), _mlp()
    opt = LocalUpdate(ours.named_parameters(), preconditioner="sophia", lr=LR, weight_decay=0.1,
                      hessian_interval=100, rho=BETA, correction="after-step")  # no refresh after k=1
    g_g = _g_g(ours)
    opt.set_global_direction(g_g)
    oracle = sophia_cls(theirs.parameters(), lr=(1 - BETA) * LR, betas=(0.965, 0.99), rho=0.04,
                        weight_decay=0.1)
    correct = _correct_by_hand(theirs, g_g, LR)
    for k in range(10):
        x, y = _data(ours, k)
        opt.bs = y.numel()
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(ours(x), y).backward()
        opt.step()
        oracle.zero_grad(set_to_none=True)
        F.cross_entropy(theirs(x), y).backward()
        oracle.step(bs=y.numel())
        correct()
    assert _max_diff(ours, theirs) < 1e-6 and _max_diff(ours, _mlp()) > 1e-3


def test_routing_sends_hidden_matrices_to_muon_and_the_rest_to_adamw() -> None:
    from adaptfl.local_update.routing import route_muon
    from adaptfl.workloads import build_model

    vit = build_model("vit-tiny", 10, 1, 28)
    chosen = route_muon([(n, p.shape) for n, p in vit.named_parameters()])
    assert "conv_proj.weight" not in chosen and "heads.head.weight" not in chosen  # first layer, head
    assert "class_token" not in chosen and "encoder.pos_embedding" not in chosen  # tokens, positions
    assert all(vit.get_parameter(n).ndim == 2 for n in chosen) and len(chosen) == 4 * 12
    shapes = [(n, p.shape) for n, p in _cnn().named_parameters()]
    assert route_muon(shapes, "all-2d") == ["0.weight", "3.weight"]  # FedPAC's code: every ≥2-D weight


def test_muon_batches_same_shaped_matrices_and_gets_each_ones_direction() -> None:
    from adaptfl.local_update.rules.muon import muon_direction, muon_directions

    gen = torch.Generator().manual_seed(3)
    gs = [torch.randn(48, 16, generator=gen) for _ in range(4)] + [torch.randn(16, 48, generator=gen),
                                                                 torch.randn(6, 2, 3, 3, generator=gen)]
    batched = muon_directions(gs, [torch.zeros_like(g) for g in gs], 0.9, [None] * len(gs), 1.0)
    alone = [muon_direction(g, torch.zeros_like(g), 0.9) for g in gs]
    for a, b in zip(batched, alone, strict=True):
        assert a.shape == b.shape
        # one batched bf16 GEMM per iteration against one per matrix: equal here, but kernels
        # that accumulate a batch in another order (AMX, GPUs) may round each entry of O one
        # bf16 ulp apart, amplified within the 5 iterations to about two (see MUON_TOLERANCE)
        torch.testing.assert_close(a, b, rtol=0, atol=MUON_TOLERANCE * max(1.0, float(b.abs().max())))
