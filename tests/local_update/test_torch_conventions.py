"""LocalUpdate as a torch optimizer in the respects torch users rely on (issue 20 §2), over every
preconditioner (and, for groups added mid-training, every trust rule): `add_param_group` then
`step()` (progressive unfreezing), torch's names in the constructor and the param groups
(`betas=(b1, b2)` for the Adam family, SophiaG's and SOAP's `betas`, torch.optim.Muon's
`momentum`), every scheduler of `torch.optim.lr_scheduler` that applies to Adam, and the
state_dict of a resumed scheduler + optimizer. Oracles: torch's AdamW where it is one, else the
same scheduler on a torch AdamW (the values it sets) and the rule the group rebuilds."""

from __future__ import annotations

import copy
import io

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.optim import lr_scheduler as S

from adaptfl.local_update import LocalUpdate
from tests.local_update.test_local_update import VARIANTS, _data, _max_diff, _mlp, _model, _train

# one configuration per preconditioner (the Adam family with correction and trust)
RULES = {"sgd": "sgd", "adam": "adam", "adamw": "adamw-corrected-act", "sophia": "sophia",
         "muon": "muon", "soap": "soap"}
SCHEDULERS = {  # every scheduler that applies to torch.optim.Adam, with small settings
    "LambdaLR": lambda o: S.LambdaLR(o, lambda k: 0.9**k),
    "MultiplicativeLR": lambda o: S.MultiplicativeLR(o, lambda k: 0.9),
    "StepLR": lambda o: S.StepLR(o, step_size=2, gamma=0.5),
    "MultiStepLR": lambda o: S.MultiStepLR(o, milestones=[1, 3], gamma=0.5),
    "ConstantLR": lambda o: S.ConstantLR(o, factor=0.5, total_iters=2),
    "LinearLR": lambda o: S.LinearLR(o, start_factor=0.25, total_iters=3),
    "ExponentialLR": lambda o: S.ExponentialLR(o, gamma=0.8),
    "PolynomialLR": lambda o: S.PolynomialLR(o, total_iters=5, power=2.0),
    "CosineAnnealingLR": lambda o: S.CosineAnnealingLR(o, T_max=5),
    "CosineAnnealingWarmRestarts": lambda o: S.CosineAnnealingWarmRestarts(o, T_0=2),
    "ChainedScheduler": lambda o: S.ChainedScheduler([S.ConstantLR(o, factor=0.5, total_iters=2),
                                                      S.ExponentialLR(o, gamma=0.9)]),
    "SequentialLR": lambda o: S.SequentialLR(o, [S.LinearLR(o, start_factor=0.5, total_iters=2),
                                                 S.ExponentialLR(o, gamma=0.9)], milestones=[2]),
    "ReduceLROnPlateau": lambda o: S.ReduceLROnPlateau(o, patience=0, factor=0.5),
    "CyclicLR": lambda o: S.CyclicLR(o, base_lr=1e-3, max_lr=1e-2, step_size_up=2),  # cycle_momentum
    "OneCycleLR": lambda o: S.OneCycleLR(o, max_lr=1e-2, total_steps=8),  # cycle_momentum
}
MOMENTUM_CYCLERS = ("CyclicLR", "OneCycleLR")
STEPS = 6


def _step_with(model: nn.Module, opt: torch.optim.Optimizer, sched, k: int) -> float:
    x, y = _data(model, k)
    opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    if isinstance(sched, S.ReduceLROnPlateau):
        sched.step(1.0)  # a plateau: every step reduces
    else:
        sched.step()
    return float(loss)


def _hyper(group: dict) -> tuple:
    """What a scheduler may set in a group: lr and the momentum entry torch's schedulers use."""
    return (group["lr"], group.get("betas", (group.get("momentum"),))[0])


# --- add_param_group ---------------------------------------------------------------------------
def test_add_param_group_mid_training_is_torch_adamw() -> None:
    """Progressive unfreezing: the head first, the rest added after 3 steps at its own lr and
    betas; torch's AdamW doing the same is the oracle (KeyError: 'step' before issue 20)."""
    ours, theirs = _mlp(), _mlp()
    opts = []
    for model in (ours, theirs):
        head = list(model[4].parameters())
        opts.append(LocalUpdate(head, lr=0.05, bias_correction="local") if model is ours else
                    torch.optim.AdamW(head, lr=0.05))
    for k in range(STEPS + 2):
        if k == 3:
            for model, opt in zip((ours, theirs), opts, strict=True):
                opt.add_param_group({"params": list(model[0].parameters()) + list(model[2].parameters()),
                                     "lr": 0.02, "betas": (0.8, 0.99)})
        for model, opt in zip((ours, theirs), opts, strict=True):
            for p in model.parameters():
                p.grad = None
            F.cross_entropy(model(_data(model, k)[0]), _data(model, k)[1]).backward()
            opt.step()
    assert _max_diff(ours, theirs) < 1e-6 and float((ours[0].weight - _mlp()[0].weight).abs().max()) > 1e-3
    assert opts[0].param_groups[1]["betas"] == (0.8, 0.99)


def _split(model: nn.Module) -> tuple[list, list, list]:
    """(the first layer's named parameters; the other matrices; the other vectors)."""
    named = list(model.named_parameters())
    first = [(n, p) for n, p in named if n.startswith("0.")]
    rest = [(n, p) for n, p in named if not n.startswith("0.")]
    return first, [(n, p) for n, p in rest if p.ndim >= 2], [(n, p) for n, p in rest if p.ndim < 2]


def _unfreezing(name: str, model: nn.Module) -> LocalUpdate:
    return LocalUpdate(_split(model)[0], **VARIANTS[name])


def _add_rest(name: str, model: nn.Module, opt: LocalUpdate) -> None:
    _, matrices, vectors = _split(model)
    muon = VARIANTS[name]["preconditioner"] == "muon"  # Muon takes matrices; vectors go to AdamW
    opt.add_param_group({"params": matrices, "lr": opt.param_groups[0]["lr"] / 2})
    opt.add_param_group({"params": vectors, **({"preconditioner": "adamw", "betas": (0.9, 0.95)}
                                               if muon else {})})


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_add_param_group_then_step_and_state_dict(name: str) -> None:
    """Every preconditioner and trust rule: groups added after 3 steps train from step 0 of
    their own, the old ones continue, and the state_dict round-trips with the added groups."""
    model = _model(name)
    opt = _unfreezing(name, model)
    _train(model, opt, 3)
    before, built = copy.deepcopy(model), len(opt.param_groups)
    _add_rest(name, model, opt)
    _train(model, opt, 2, start=3)
    assert all(opt.state[p]["step"] == 2 for g in opt.param_groups[built:] for p in g["params"])
    assert all(opt.state[p]["step"] == 5 for g in opt.param_groups[:built] for p in g["params"])
    moved = [float((p - q).abs().max()) for (n, p), (_, q) in
             zip(model.named_parameters(), before.named_parameters(), strict=True)]
    assert min(moved) > 0.0, moved  # old and new parameters alike
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)
    twin = copy.deepcopy(model)
    twin_opt = _unfreezing(name, twin)
    _add_rest(name, twin, twin_opt)
    twin_opt.load_state_dict(torch.load(io.BytesIO(buffer.getvalue()), weights_only=True))
    _train(model, opt, 2, start=5)
    _train(twin, twin_opt, 2, start=5)
    assert _max_diff(model, twin) == 0.0


# --- torch's names ----------------------------------------------------------------------------
def test_betas_round_trip_and_drive_the_step_as_in_torch_adamw() -> None:
    ours, theirs = _mlp(), _mlp()
    opt = LocalUpdate(ours.parameters(), lr=0.05, betas=(0.8, 0.9), bias_correction="local")
    oracle = torch.optim.AdamW(theirs.parameters(), lr=0.05, betas=(0.8, 0.9))
    assert opt.param_groups[0]["betas"] == (0.8, 0.9) and opt.defaults["betas"] == (0.8, 0.9)
    assert "beta1" not in opt.param_groups[0]  # one entry per value: the one schedulers write
    for k in range(STEPS):
        if k == 3:  # set in the group, as a scheduler does: the next steps use it
            for o in (opt, oracle):
                o.param_groups[0]["betas"] = (0.5, 0.95)
        for model, o in ((ours, opt), (theirs, oracle)):
            o.zero_grad(set_to_none=True)
            F.cross_entropy(model(_data(model, k)[0]), _data(model, k)[1]).backward()
            o.step()
    assert _max_diff(ours, theirs) < 1e-6
    again = LocalUpdate(_mlp().parameters(), lr=0.05, bias_correction="local")
    again.load_state_dict(opt.state_dict())
    assert again.param_groups[0]["betas"] == (0.5, 0.95) and again.rule(again.param_groups[0]).beta1 == 0.5


def test_run_config_names_still_work_and_both_names_are_refused() -> None:
    model = _mlp()
    assert LocalUpdate(model.parameters(), beta1=0.7).param_groups[0]["betas"] == (0.7, 0.999)
    with pytest.raises(TypeError, match="both betas= and beta1="):
        LocalUpdate(model.parameters(), betas=(0.8, 0.9), beta1=0.7)
    with pytest.raises(ValueError, match=r"betas=0.9: expected \(beta1, beta2\)"):
        LocalUpdate(model.parameters(), betas=0.9)
    muon = LocalUpdate(model.named_parameters(), preconditioner="muon", momentum=0.8,
                       muon_routing="all-2d")
    assert muon.param_groups[0]["momentum"] == 0.8 and muon.rule(muon.param_groups[0]).muon_momentum == 0.8
    sophia = LocalUpdate(model.parameters(), preconditioner="sophia", betas=(0.9, 0.95))
    assert sophia.rule(sophia.param_groups[0]).sophia_beta2 == 0.95
    soap = LocalUpdate(model.parameters(), preconditioner="soap", betas=(0.9, 0.9))
    assert soap.rule(soap.param_groups[0]).soap_beta1 == 0.9
    # a group written with the field's own name (an optimizer state_dict saved before) still reads
    old = LocalUpdate(model.parameters(), lr=0.05)
    state = old.state_dict()
    group = state["param_groups"][0]
    group["beta1"], group["beta2"] = group.pop("betas")[0] - 0.3, 0.99
    old.load_state_dict(state)
    assert old.rule(old.param_groups[0]).beta1 == pytest.approx(0.6)


# --- schedulers over every preconditioner -------------------------------------------------------
@pytest.mark.parametrize("scheduler", sorted(SCHEDULERS))
@pytest.mark.parametrize("rule", sorted(RULES))
def test_every_scheduler_drives_every_preconditioner(rule: str, scheduler: str) -> None:
    """The scheduler sets the same lr (and momentum or β1) in our groups as in torch's AdamW's,
    and the rule the step runs is rebuilt from them; plain SGD has no momentum for
    cycle_momentum, and says so as torch does for any optimizer without one."""
    name = RULES[rule]
    model = _model(name)
    opt = LocalUpdate(model.named_parameters(), **VARIANTS[name])
    if rule == "sgd" and scheduler in MOMENTUM_CYCLERS:
        with pytest.raises(ValueError, match="optimizer must support momentum or beta1"):
            SCHEDULERS[scheduler](opt)
        return
    reference = torch.optim.AdamW([torch.zeros(1, requires_grad=True)], lr=opt.param_groups[0]["lr"],
                                  betas=(0.9, 0.999))
    if "momentum" in opt.defaults and "betas" not in opt.defaults:  # Muon: torch.optim.Muon's
        reference = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=opt.param_groups[0]["lr"],
                                    momentum=opt.defaults["momentum"])
    sched, ref_sched = SCHEDULERS[scheduler](opt), SCHEDULERS[scheduler](reference)
    seen = []
    for k in range(STEPS):
        _step_with(model, opt, sched, k)
        reference.step()
        if isinstance(ref_sched, S.ReduceLROnPlateau):
            ref_sched.step(1.0)
        else:
            ref_sched.step()
        group = opt.param_groups[0]
        assert group["lr"] == pytest.approx(reference.param_groups[0]["lr"], rel=1e-12)
        if scheduler in MOMENTUM_CYCLERS:
            assert _hyper(group)[1] == pytest.approx(_hyper(reference.param_groups[0])[1], rel=1e-12)
        seen.append(_hyper(group))
        rule_now = opt.rule(group)  # what the next step runs with
        momentum_field = {"adam": "beta1", "adamw": "beta1", "sophia": "sophia_beta1",
                          "soap": "soap_beta1", "muon": "muon_momentum"}.get(rule)
        if momentum_field:
            assert getattr(rule_now, momentum_field) == _hyper(group)[1]
    assert len(set(seen)) > 1  # the scheduler changed something


def test_one_cycle_momentum_reaches_the_adamw_step() -> None:
    """OneCycleLR with its defaults (cycle_momentum: β1 from 0.95 to 0.85 and back) on ours and on
    torch's AdamW: the same trajectory."""
    ours, theirs = _mlp(), _mlp()
    opt = LocalUpdate(ours.parameters(), lr=0.01, bias_correction="local")
    oracle = torch.optim.AdamW(theirs.parameters(), lr=0.01)
    scheds = [S.OneCycleLR(o, max_lr=0.05, total_steps=STEPS + 2) for o in (opt, oracle)]
    for k in range(STEPS):
        for model, o, s in ((ours, opt, scheds[0]), (theirs, oracle, scheds[1])):
            _step_with(model, o, s, k)
    assert _max_diff(ours, theirs) < 1e-6 and opt.param_groups[0]["betas"][0] != 0.9


@pytest.mark.parametrize("rule", sorted(RULES))
def test_a_resumed_scheduler_and_optimizer_continue_bit_for_bit(rule: str) -> None:
    name = RULES[rule]
    model = _model(name)
    opt = LocalUpdate(model.named_parameters(), **VARIANTS[name])
    make = SCHEDULERS["CosineAnnealingLR" if rule == "sgd" else "OneCycleLR"]
    sched = make(opt)
    for k in range(3):
        _step_with(model, opt, sched, k)
    saved = io.BytesIO()
    torch.save({"opt": opt.state_dict(), "sched": sched.state_dict()}, saved)
    twin = copy.deepcopy(model)
    twin_opt = LocalUpdate(twin.named_parameters(), **VARIANTS[name])
    twin_sched = make(twin_opt)
    blob = torch.load(io.BytesIO(saved.getvalue()), weights_only=False)
    twin_opt.load_state_dict(blob["opt"])
    twin_sched.load_state_dict(blob["sched"])
    for k in range(3, STEPS):
        _step_with(model, opt, sched, k)
        _step_with(twin, twin_opt, twin_sched, k)
        assert twin_opt.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    assert _max_diff(model, twin) == 0.0
